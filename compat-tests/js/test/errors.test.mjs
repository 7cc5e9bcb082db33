// How envd's errors reach JS SDK users: Connect codes and HTTP statuses must
// map onto the SDK's error classes.
import { test, before } from 'node:test'
import assert from 'node:assert/strict'
import { AuthenticationError, FileNotFoundError, NotFoundError } from 'e2b'
import { newSandbox, scratch, envdHeaders, ENVD_URL, T } from './helpers.mjs'

let sbx
before(async () => {
  sbx = await newSandbox()
})

const BAD_USER = 'no-such-user-compat'
const isAuth = (e) => {
  assert.ok(e instanceof AuthenticationError, `expected AuthenticationError, got ${e?.constructor?.name}: ${e?.message}`)
  return true
}

test('errors: GET /health answers 2xx with no auth', T, async () => {
  // sandboxd mode: through the proxy, routing headers only (no access token).
  const r = await fetch(`${ENVD_URL}/health`, { headers: envdHeaders(sbx, { token: false }) })
  assert.ok(r.ok, `status ${r.status}`)
  assert.equal(r.status, 204)
  assert.equal(await sbx.isRunning(), true)
})

test('errors: reading a missing file raises FileNotFoundError / NotFoundError', T, async () => {
  const path = `${scratch('missing')}/nope.txt`
  await assert.rejects(sbx.files.read(path), FileNotFoundError)
  await assert.rejects(sbx.files.read(path), NotFoundError)
})

test('errors: unknown user on commands.run raises AuthenticationError', T, async () => {
  await assert.rejects(sbx.commands.run('whoami', { user: BAD_USER }), isAuth)
})

test('errors: unknown user on an RPC file call raises AuthenticationError', T, async () => {
  await assert.rejects(sbx.files.list('/', { user: BAD_USER }), isAuth)
  await assert.rejects(sbx.files.makeDir('/tmp/compat-bad-user', { user: BAD_USER }), isAuth)
})

test('errors: unknown user on GET/POST /files raises AuthenticationError', T, async () => {
  await assert.rejects(sbx.files.read('/etc/hostname', { user: BAD_USER }), isAuth)
  await assert.rejects(sbx.files.write('/tmp/compat-bad-user.txt', 'x', { user: BAD_USER }), isAuth)
})

test('errors: unknown user on pty.create raises AuthenticationError', T, async () => {
  await assert.rejects(sbx.pty.create({ cols: 80, rows: 24, onData: () => {}, user: BAD_USER }), isAuth)
})

test('errors: /files error bodies are JSON {code, message}', T, async () => {
  const headers = envdHeaders(sbx)
  const r = await fetch(`${ENVD_URL}/files?path=${encodeURIComponent('/no/such/file')}`, { headers })
  assert.equal(r.status, 404)
  const body = await r.json()
  assert.equal(body.code, 404)
  assert.ok(body.message)
  const u = await fetch(`${ENVD_URL}/files?path=/etc/hostname&username=${BAD_USER}`, { headers })
  assert.equal(u.status, 401)
  assert.equal((await u.json()).code, 401)
})

test('errors: sendStdin to an unknown pid raises NotFoundError', T, async () => {
  await assert.rejects(sbx.commands.sendStdin(999_999, 'x'), (e) => {
    assert.ok(e instanceof NotFoundError, `expected NotFoundError, got ${e?.constructor?.name}: ${e?.message}`)
    return true
  })
})

test('errors: resize and kill of an unknown pid', T, async () => {
  await assert.rejects(sbx.pty.resize(999_999, { cols: 10, rows: 10 }), (e) => {
    assert.ok(e instanceof NotFoundError, `expected NotFoundError, got ${e?.constructor?.name}: ${e?.message}`)
    return true
  })
  assert.equal(await sbx.pty.kill(999_999), false)
})
