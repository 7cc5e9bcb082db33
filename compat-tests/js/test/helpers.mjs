// Shared setup for the JS compat suite. Two targets (COMPAT_TARGET):
//
// - `debug` (default): the real `e2b` SDK in debug mode. Sandbox.create()
//   makes no API call and talks to envd at localhost:49983 with sandbox id
//   `debug_sandbox_id`; kill() is a no-op. E2B_DEBUG is forced so a stray
//   environment can never point these tests at a remote service.
// - `sandboxd`: the SDK against a real sandboxd (control plane + local
//   backend) through E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY, no debug
//   mode. Both URLs must be loopback; every sandbox a test file creates with
//   newSandbox() is killed after the file's tests. With
//   COMPAT_ADDRESSING=domain (run.sh's domain mode) only E2B_DOMAIN and
//   E2B_API_KEY are set, as the SDKs' next major version will have it: the API
//   at https://api.<domain>, each sandbox port at https://<port>-<id>.<domain>
//   (a *.localhost name, so loopback).
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import net from 'node:net'
import tls from 'node:tls'
import { after } from 'node:test'
import { Sandbox } from 'e2b'

export const TARGET = process.env.COMPAT_TARGET || 'debug'
export const SANDBOXD = TARGET === 'sandboxd'
/** sandboxd's backend in sandboxd mode (run.sh's incus mode sets `incus`). */
export const BACKEND = process.env.COMPAT_BACKEND || 'local'
// run.sh's cluster mode: volumes answer 501 on a remote Incus (incus/README.md).
export const NO_VOLUMES = process.env.COMPAT_NO_VOLUMES ? 'volumes are not supported on this backend (COMPAT_NO_VOLUMES)' : false
if (TARGET !== 'debug' && TARGET !== 'sandboxd') throw new Error(`COMPAT_TARGET=${TARGET}: want debug or sandboxd`)

const isLoopback = (u) => {
  try {
    return ['127.0.0.1', 'localhost', '[::1]'].includes(new URL(u).hostname)
  } catch {
    return false
  }
}
/** run.sh's domain mode: E2B_DOMAIN only, TLS, host routing. */
export const DOMAIN_MODE = SANDBOXD && process.env.COMPAT_ADDRESSING === 'domain'
if (DOMAIN_MODE) {
  delete process.env.E2B_DEBUG
  for (const v of ['E2B_DOMAIN', 'E2B_API_KEY']) {
    if (!process.env[v]) throw new Error(`COMPAT_ADDRESSING=domain needs ${v}`)
  }
  for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_VOLUME_API_URL']) {
    if (process.env[v]) throw new Error(`COMPAT_ADDRESSING=domain: ${v} must not be set`)
  }
  // nss-myhostname resolves every *.localhost name to loopback.
  if (!new URL(`https://${process.env.E2B_DOMAIN}`).hostname.endsWith('.localhost')) {
    throw new Error(`E2B_DOMAIN=${process.env.E2B_DOMAIN} is not a *.localhost domain`)
  }
} else if (SANDBOXD) {
  delete process.env.E2B_DEBUG
  for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
    if (!process.env[v]) throw new Error(`COMPAT_TARGET=sandboxd needs ${v}`)
  }
  for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL']) {
    if (!isLoopback(process.env[v])) throw new Error(`${v}=${process.env[v]} is not a loopback URL`)
  }
} else {
  process.env.E2B_DEBUG = 'true'
  process.env.E2B_API_KEY ??= 'e2b_' + '0'.repeat(40)
}

/** The E2B API as the SDK reaches it. */
export const API_URL = DOMAIN_MODE ? `https://api.${process.env.E2B_DOMAIN}` : process.env.E2B_API_URL
export const HOME = '/home/user'
/**
 * Where raw clients send envd requests, with envdHeaders(sbx) for the route:
 * E2B_SANDBOX_URL, or in domain mode the API host (sandboxd routes by those
 * headers on any host, as by `<port>-<id>.<domain>`).
 */
export const ENVD_URL = DOMAIN_MODE ? API_URL : process.env.E2B_SANDBOX_URL || 'http://localhost:49983'
/** Per-test timeout (ms) so a hanging stream fails the test instead of CI. */
export const T = { timeout: 30_000 }
/** Options for tests that only make sense against a real sandboxd. */
export const SANDBOXD_ONLY = { ...T, skip: SANDBOXD ? false : 'sandboxd mode only (COMPAT_TARGET=sandboxd)' }

const created = new Set()
after(async () => {
  for (const s of created) await s.kill().catch(() => {})
})

/** A sandbox for one test file; in sandboxd mode it is killed after the file. */
export async function newSandbox(opts) {
  if (!SANDBOXD) {
    const sbx = await Sandbox.create()
    assert.equal(sbx.sandboxId, 'debug_sandbox_id', 'SDK is not in debug mode')
    return sbx
  }
  const sbx = await Sandbox.create({ timeoutMs: 600_000, ...opts })
  assert.notEqual(sbx.sandboxId, 'debug_sandbox_id', 'SDK is in debug mode')
  created.add(sbx)
  return sbx
}

/** A sandbox of template (sandboxd mode), killed after the test file. */
export async function newSandboxFrom(template, opts) {
  const sbx = await Sandbox.create(template, { timeoutMs: 600_000, ...opts })
  created.add(sbx)
  return sbx
}

/**
 * Headers a raw HTTP client needs to reach sbx's envd: nothing in debug mode;
 * through sandboxd's proxy the routing headers the SDK sends (E2b-Sandbox-Id,
 * E2b-Sandbox-Port) and, unless token is false, the envd access token.
 */
export function envdHeaders(sbx, { token = true } = {}) {
  if (!SANDBOXD) return {}
  const h = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' }
  if (token && sbx.envdAccessToken) h['X-Access-Token'] = sbx.envdAccessToken
  return h
}

/** A raw socket to url's origin: TLS (by its host name) for https. */
export function rawConnect(url) {
  const { protocol, hostname, port } = new URL(url)
  if (protocol === 'https:') return tls.connect({ host: hostname, port: Number(port || 443), servername: hostname })
  return net.connect(Number(port || 80), hostname)
}

/** A fresh absolute path under the default user's home, unique per call. */
export function scratch(prefix = 'js') {
  return `${HOME}/compat-${prefix}-${randomBytes(4).toString('hex')}`
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

/**
 * Polls pred() until it is truthy or timeoutMs elapses, then fails with
 * what (a string, or a function called at failure time for current state).
 */
export async function waitFor(pred, what, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await pred()) return
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${typeof what === 'function' ? what() : what}`)
    await sleep(50)
  }
}

/** Resolves true once pid is no longer a live process (checked as root). */
export async function processGone(sbx, pid) {
  const r = await sbx.commands.run(`kill -0 ${pid} 2>/dev/null && echo alive || echo gone`, { user: 'root' })
  return r.stdout.trim() === 'gone'
}

/** Best-effort removal of a scratch path; never fails the test. */
export async function cleanup(sbx, path) {
  try {
    await sbx.files.remove(path, { user: 'root' })
  } catch {}
}

/** Deterministic ~2 MiB of text: the lines 1..320000 as `seq` prints them. */
export function seqText(n) {
  const parts = new Array(n)
  for (let i = 0; i < n; i++) parts[i] = String(i + 1)
  return parts.join('\n') + '\n'
}
