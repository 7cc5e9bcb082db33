// Shared setup for the JS compat suite. Two targets (COMPAT_TARGET):
//
// - `debug` (default): the real `e2b` SDK in debug mode. Sandbox.create()
//   makes no API call and talks to envd at localhost:49983 with sandbox id
//   `debug_sandbox_id`; kill() is a no-op. E2B_DEBUG is forced so a stray
//   environment can never point these tests at a remote service.
// - `sandboxd`: the SDK against a real sandboxd (control plane + local
//   backend) through E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY, no debug
//   mode. Both URLs must be loopback; every sandbox a test file creates with
//   newSandbox() is killed after the file's tests.
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after } from 'node:test'
import { Sandbox } from 'e2b'

export const TARGET = process.env.COMPAT_TARGET || 'debug'
export const SANDBOXD = TARGET === 'sandboxd'
/** sandboxd's backend in sandboxd mode (run.sh's incus mode sets `incus`). */
export const BACKEND = process.env.COMPAT_BACKEND || 'local'
if (TARGET !== 'debug' && TARGET !== 'sandboxd') throw new Error(`COMPAT_TARGET=${TARGET}: want debug or sandboxd`)

const isLoopback = (u) => {
  try {
    return ['127.0.0.1', 'localhost', '[::1]'].includes(new URL(u).hostname)
  } catch {
    return false
  }
}
if (SANDBOXD) {
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

export const HOME = '/home/user'
export const ENVD_URL = process.env.E2B_SANDBOX_URL || 'http://localhost:49983'
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
