// Shared setup for the JS compat suite. The real `e2b` SDK runs in debug mode:
// Sandbox.create() makes no API call and talks to envd at localhost:49983 with
// sandbox id `debug_sandbox_id`; kill() is a no-op. E2B_DEBUG is forced so a
// stray environment can never point these tests at a remote service.
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { Sandbox } from 'e2b'

process.env.E2B_DEBUG = 'true'
process.env.E2B_API_KEY ??= 'e2b_' + '0'.repeat(40)

export const HOME = '/home/user'
export const ENVD_URL = process.env.E2B_SANDBOX_URL || 'http://localhost:49983'
/** Per-test timeout (ms) so a hanging stream fails the test instead of CI. */
export const T = { timeout: 30_000 }

export async function newSandbox() {
  const sbx = await Sandbox.create()
  assert.equal(sbx.sandboxId, 'debug_sandbox_id', 'SDK is not in debug mode')
  return sbx
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
