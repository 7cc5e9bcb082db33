// A "secure" sandbox: envd initialised by POST /init with an access token,
// sandbox-wide envs and a default workdir, as sandboxd's control plane does.
// The suite starts its own envd for this on 127.0.0.1:49985 (the token would
// lock the shared one) and builds the SDK's Sandbox with that token, the
// envd URL (E2B_SANDBOX_URL rule) and envd version 0.6.13, so the real SDK
// sends X-Access-Token and signs uploadUrl/downloadUrl.
//
// Sandbox's constructor is internal API (what Sandbox.create() calls after
// the control plane answered); if a future SDK changes it, fix newSecure().
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { openSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { Sandbox, ConnectionConfig, getSignature, AuthenticationError } from 'e2b'
import { HOME, T as T0, SANDBOXD, scratch, sleep } from './helpers.mjs'

// Debug mode only: this file builds Sandbox with the internal constructor
// against its own envd. In sandboxd mode lifecycle.test.mjs covers the secure
// sandbox sandboxd really creates.
const T = { ...T0, skip: SANDBOXD ? 'debug mode only: builds a Sandbox with internal constructors against its own envd' : false }

const PORT = Number(process.env.COMPAT_SECURE_PORT || 49985)
const URL_ = `http://127.0.0.1:${PORT}`
const TOKEN = 'compat-secret-token-' + Math.random().toString(16).slice(2)
const ENVD_BIN = process.env.COMPAT_ENVD || fileURLToPath(new URL('../../../bin/envd', import.meta.url))

let child
let sbx
let dir

function newSecure(token = TOKEN) {
  const config = new ConnectionConfig({ sandboxUrl: URL_, debug: true })
  return new Sandbox({ ...config, sandboxId: 'secure_sandbox_id', envdVersion: '0.6.13', envdAccessToken: token })
}

before(async () => {
  if (SANDBOXD) return
  const log = process.env.COMPAT_LOG_DIR ? openSync(`${process.env.COMPAT_LOG_DIR}/envd-secure.log`, 'a') : 'ignore'
  child = spawn(ENVD_BIN, ['--listen', `127.0.0.1:${PORT}`, '--log-level', 'debug'], { stdio: ['ignore', log, log] })
  const deadline = Date.now() + 10_000
  for (;;) {
    try {
      if ((await fetch(`${URL_}/health`)).ok) break
    } catch {}
    if (Date.now() > deadline || child.exitCode !== null) throw new Error(`second envd on :${PORT} did not start`)
    await sleep(100)
  }
  const r = await fetch(`${URL_}/init`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({
      accessToken: TOKEN,
      envVars: { SANDBOX_WIDE: 'from-init', OVERRIDE_ME: 'init' },
      defaultUser: 'user',
      timestamp: new Date().toISOString(),
    }),
  })
  assert.equal(r.status, 204, await r.text())
  sbx = newSecure()
  dir = scratch('secure')
})

after(async () => {
  try {
    await sbx?.files.remove(dir, { user: 'root' })
  } catch {}
  child?.kill('SIGTERM')
})

test('secure: SDK with the token runs commands and file operations', T, async () => {
  assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
  await sbx.files.write(`${dir}/a.txt`, 'secret')
  assert.equal(await sbx.files.read(`${dir}/a.txt`), 'secret')
  assert.equal((await sbx.files.list(dir)).length, 1)
})

test('secure: a wrong token is rejected with AuthenticationError (RPC and /files)', T, async () => {
  const bad = newSecure('not-the-token')
  await assert.rejects(bad.commands.run('true'), AuthenticationError)
  await assert.rejects(bad.files.list('/'), AuthenticationError)
  await assert.rejects(bad.files.read('/etc/hostname'), AuthenticationError)
})

test('secure: raw requests without a token get 401 JSON; /health stays open', T, async () => {
  assert.equal((await fetch(`${URL_}/health`)).status, 204)
  const rpc = await fetch(`${URL_}/filesystem.Filesystem/Stat`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' },
    body: JSON.stringify({ path: '/tmp' }),
  })
  assert.equal(rpc.status, 401)
  const files = await fetch(`${URL_}/files?path=/etc/hostname`)
  assert.equal(files.status, 401)
  assert.equal((await files.json()).code, 401)
  const ok = await fetch(`${URL_}/files?path=/etc/hostname`, { headers: { 'X-Access-Token': TOKEN } })
  assert.equal(ok.status, 200)
  await ok.arrayBuffer()
})

test('secure: signed downloadUrl/uploadUrl from the SDK work with a plain client', T, async () => {
  const path = `${dir}/signed.txt`
  const up = await sbx.uploadUrl(path)
  assert.match(up, /[?&]signature=v1_/)
  const form = new FormData()
  form.append('file', new Blob(['via signed url']), 'signed.txt')
  const res = await fetch(up, { method: 'POST', body: form })
  assert.equal(res.status, 200, await res.clone().text())
  assert.equal((await res.json())[0].path, path)
  const down = await sbx.downloadUrl(path)
  const got = await fetch(down)
  assert.equal(got.status, 200)
  assert.equal(await got.text(), 'via signed url')
  // Explicit user and an expiring signature.
  const asUser = await fetch(await sbx.downloadUrl(path, { user: 'user', useSignatureExpiration: 60 }))
  assert.equal(asUser.status, 200)
  assert.equal(await asUser.text(), 'via signed url')
})

test('secure: signatures are checked (operation, path, user, expiry)', T, async () => {
  const path = `${dir}/sig.txt`
  await sbx.files.write(path, 'x')
  const url = (sig, extra = '') =>
    `${URL_}/files?path=${encodeURIComponent(path)}&signature=${encodeURIComponent(sig.signature)}${extra}`
  const read = await getSignature({ path, operation: 'read', envdAccessToken: TOKEN })
  assert.equal((await fetch(url(read))).status, 200)
  // A write signature does not allow reading, nor a signature for another path.
  const write = await getSignature({ path, operation: 'write', envdAccessToken: TOKEN })
  assert.equal((await fetch(url(write))).status, 401)
  const other = await getSignature({ path: `${path}.other`, operation: 'read', envdAccessToken: TOKEN })
  assert.equal((await fetch(url(other))).status, 401)
  // Signed for user `root` but presented without username.
  const rootSig = await getSignature({ path, operation: 'read', user: 'root', envdAccessToken: TOKEN })
  assert.equal((await fetch(url(rootSig))).status, 401)
  assert.equal((await fetch(url(rootSig, '&username=root'))).status, 200)
  // Expiry: valid in the future, rejected in the past.
  const future = await getSignature({ path, operation: 'read', expirationInSeconds: 60, envdAccessToken: TOKEN })
  assert.equal((await fetch(url(future, `&signature_expiration=${future.expiration}`))).status, 200)
  const past = await getSignature({ path, operation: 'read', expirationInSeconds: -10, envdAccessToken: TOKEN })
  assert.equal((await fetch(url(past, `&signature_expiration=${past.expiration}`))).status, 401)
  // Tampering with the expiry breaks the signature.
  assert.equal((await fetch(url(future, `&signature_expiration=${future.expiration + 100}`))).status, 401)
})

test('secure: /init envVars reach commands; per-command envs win', T, async () => {
  const r = await sbx.commands.run('echo "$SANDBOX_WIDE|$OVERRIDE_ME"', { envs: { OVERRIDE_ME: 'command' } })
  assert.equal(r.stdout, 'from-init|command\n')
  assert.equal((await sbx.commands.run('echo $SANDBOX_WIDE', { user: 'root' })).stdout, 'from-init\n')
  assert.equal((await sbx.commands.run('pwd')).stdout, `${HOME}\n`)
})

test('secure: re-initialising without the token is refused', T, async () => {
  const r = await fetch(`${URL_}/init`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ accessToken: 'hijack' }),
  })
  assert.equal(r.status, 401)
  assert.equal((await sbx.commands.run('echo still-ok')).stdout, 'still-ok\n')
})
