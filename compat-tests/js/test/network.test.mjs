// E2B's network policy through the real e2b JS SDK against a real sandboxd:
// Sandbox.create({ network: { allowOut, denyOut } }), getInfo().network,
// sandbox.updateNetwork() and the API's errors for bad or unsupported input.
// Reachability is tested from inside the sandbox (python3) against the fake
// internet run.sh starts (compat-tests/fakeinet): servers ONE and TWO on
// COMPAT_INET_ONE / COMPAT_INET_TWO with HTTP on 80 and HTTPS on 443, and a
// DNS server on ONE (sandboxd's --egress-dns) that knows allowed.sbx.test,
// denied.sbx.test and a.wild.sbx.test (ONE) and evil.sbx.test (TWO).
// sandboxd mode only; the whole file skips without the fake internet.
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { Sandbox, SandboxError, CommandExitError, ALL_TRAFFIC } from 'e2b'
import { SANDBOXD } from './helpers.mjs'

const ONE = process.env.COMPAT_INET_ONE
const TWO = process.env.COMPAT_INET_TWO
const SKIP = !SANDBOXD
  ? 'sandboxd mode only (COMPAT_TARGET=sandboxd)'
  : !ONE || !TWO
    ? 'no fake internet: COMPAT_INET_ONE / COMPAT_INET_TWO are unset (run.sh starts compat-tests/fakeinet in the sandboxd and incus modes)'
    : false
const O = { timeout: 180_000, skip: SKIP }
const REPLY = 'from-inet ' // how the fake servers' answers start

const RUN = randomBytes(4).toString('hex') // this file's metadata tag
const made = new Set() // every sandbox this file created; killed in after()
after(async () => {
  for (const id of made) await Sandbox.kill(id).catch(() => {})
})

// get.py HOST PORT tls|http [CONNECT_ADDR [SNI]]: GET / with Host: HOST on
// CONNECT_ADDR (default HOST), over TLS (no verification) with SNI (default
// HOST); prints the answer. A refused, dropped or unresolvable connection
// exits non-zero.
const GET_PY = `import socket, ssl, sys
host, port, tls = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "tls"
addr = sys.argv[4] if len(sys.argv) > 4 else host
sni = sys.argv[5] if len(sys.argv) > 5 else host
s = socket.create_connection((addr, port), timeout=3)
if tls:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    s = ctx.wrap_socket(s, server_hostname=sni)
s.sendall(("GET / HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n" % host).encode())
data = b""
while True:
    d = s.recv(4096)
    if not d:
        break
    data += d
print(data.decode(errors="replace"))
`

async function create(network, opts = {}) {
  const sbx = await Sandbox.create({ timeoutMs: 300_000, ...opts, network, metadata: { compatRun: RUN } })
  made.add(sbx.sandboxId)
  await sbx.files.write('/tmp/get.py', GET_PY)
  return sbx
}

/** Runs get.py; ok when it exited 0 with a fake server's answer. */
async function get(sbx, ...args) {
  const cmd = `python3 /tmp/get.py ${args.join(' ')}`
  try {
    const r = await sbx.commands.run(cmd, { timeoutMs: 30_000 })
    return { ok: r.stdout.includes(REPLY), out: `${cmd}: ${r.stdout}${r.stderr}` }
  } catch (e) {
    if (!(e instanceof CommandExitError)) throw e
    return { ok: false, out: `${cmd}: exit ${e.exitCode}: ${e.stdout}${e.stderr}` }
  }
}

async function answers(sbx, want, ...args) {
  const r = await get(sbx, ...args)
  assert.ok(r.ok, `want an answer: ${r.out}`)
  if (want) assert.ok(r.out.includes(want), `want ${JSON.stringify(want)} in the answer: ${r.out}`)
}

async function refused(sbx, ...args) {
  const r = await get(sbx, ...args)
  assert.ok(!r.ok, `want no answer: ${r.out}`)
}

/** getInfo's allowOut / denyOut, [] for a missing list. */
async function policy(sbx) {
  const n = (await sbx.getInfo()).network ?? {}
  return { allowOut: n.allowOut ?? [], denyOut: n.denyOut ?? [] }
}

/** Asserts that p rejects with the API's error of status (a SandboxError) naming what. */
async function apiError(p, status, what) {
  let err
  try {
    await p
  } catch (e) {
    err = e
  }
  assert.ok(err, `want an error naming ${what}, got success`)
  assert.ok(err instanceof SandboxError, `want a SandboxError, got ${err?.constructor?.name}: ${err?.message}`)
  assert.ok(err.message.startsWith(`${status}:`), `want status ${status}: ${err.message}`)
  assert.ok(err.message.includes(what), `want ${what} in the message: ${err.message}`)
  return err
}

test('network: no policy: ONE and TWO answer', O, async () => {
  const sbx = await create(undefined)
  await answers(sbx, `host=${ONE}`, ONE, 80, 'http')
  await answers(sbx, `host=${TWO}`, TWO, 80, 'http')
  assert.deepEqual(await policy(sbx), { allowOut: [], denyOut: [] })
})

test('network: allowOut [ONE] in denyOut [ALL_TRAFFIC]: ONE answers, TWO is refused; getInfo shows the policy', O, async () => {
  assert.equal(ALL_TRAFFIC, '0.0.0.0/0')
  const sbx = await create({ allowOut: [ONE], denyOut: [ALL_TRAFFIC] })
  await answers(sbx, `host=${ONE}`, ONE, 80, 'http')
  await answers(sbx, `host=${ONE}`, ONE, 443, 'tls')
  await refused(sbx, TWO, 80, 'http')
  await refused(sbx, TWO, 443, 'tls')
  assert.deepEqual(await policy(sbx), { allowOut: [ONE], denyOut: [ALL_TRAFFIC] })
  // The callback form of the selectors sends the same.
  const cb = await create({ allowOut: () => [ONE], denyOut: ({ allTraffic }) => [allTraffic] })
  assert.deepEqual(await policy(cb), { allowOut: [ONE], denyOut: [ALL_TRAFFIC] })
  await refused(cb, TWO, 80, 'http')
})

test('network: denyOut [TWO/32]: ONE answers, TWO is refused', O, async () => {
  const sbx = await create({ denyOut: [`${TWO}/32`] })
  await answers(sbx, `host=${ONE}`, ONE, 80, 'http')
  await refused(sbx, TWO, 80, 'http')
  await refused(sbx, TWO, 443, 'tls')
  assert.deepEqual(await policy(sbx), { allowOut: [], denyOut: [`${TWO}/32`] })
})

test('network: domains in allowOut: allowed names answer over TLS and HTTP, others are refused by DNS and by the proxy', O, async () => {
  const sbx = await create({ allowOut: ['allowed.sbx.test', '*.wild.sbx.test'], denyOut: [ALL_TRAFFIC] })
  await answers(sbx, 'host=allowed.sbx.test', 'allowed.sbx.test', 443, 'tls')
  await answers(sbx, 'host=allowed.sbx.test', 'allowed.sbx.test', 80, 'http')
  await answers(sbx, 'host=a.wild.sbx.test', 'a.wild.sbx.test', 443, 'tls')
  await refused(sbx, 'denied.sbx.test', 443, 'tls') // NXDOMAIN
  await refused(sbx, 'denied.sbx.test', 443, 'tls', ONE) // by address: the proxy checks the SNI
  await refused(sbx, ONE, 80, 'http') // a bare address in Host
  // A forged SNI: to TWO's address with an allowed name, the proxy dials
  // the name itself (ONE); with a name not allowed, nothing.
  await answers(sbx, 'host=allowed.sbx.test', 'allowed.sbx.test', 443, 'tls', TWO, 'allowed.sbx.test')
  await refused(sbx, 'evil.sbx.test', 443, 'tls', TWO, 'evil.sbx.test')
  assert.deepEqual(await policy(sbx), { allowOut: ['allowed.sbx.test', '*.wild.sbx.test'], denyOut: [ALL_TRAFFIC] })
})

test('network: updateNetwork moves the allowance live, {} clears it', O, async () => {
  const sbx = await create({ allowOut: [ONE], denyOut: [ALL_TRAFFIC] })
  await answers(sbx, null, ONE, 80, 'http')
  await refused(sbx, TWO, 80, 'http')

  await sbx.updateNetwork({ allowOut: [TWO], denyOut: [ALL_TRAFFIC] })
  assert.deepEqual(await policy(sbx), { allowOut: [TWO], denyOut: [ALL_TRAFFIC] })
  await answers(sbx, `host=${TWO}`, TWO, 80, 'http')
  await refused(sbx, ONE, 80, 'http')

  await sbx.updateNetwork({})
  assert.deepEqual(await policy(sbx), { allowOut: [], denyOut: [] })
  await answers(sbx, null, ONE, 80, 'http')
  await answers(sbx, null, TWO, 80, 'http')

  // The static form, by id.
  await Sandbox.updateNetwork(sbx.sandboxId, { denyOut: [`${ONE}/32`] })
  assert.deepEqual(await policy(sbx), { allowOut: [], denyOut: [`${ONE}/32`] })
  await refused(sbx, ONE, 80, 'http')
  await answers(sbx, null, TWO, 80, 'http')
})

test('network: bad input is 400 naming the field; rules are 501', O, async () => {
  // The SDK raises the API's 400 as its base SandboxError ("400: <message>").
  await apiError(create({ denyOut: ['example.com'] }), 400, 'network.denyOut')
  await apiError(create({ allowOut: ['allowed.sbx.test'] }), 400, 'network.allowOut')
  await apiError(create({ allowOut: ['allowed.sbx.test'], denyOut: [`${TWO}/32`] }), 400, 'network.allowOut')
  await apiError(create({ denyOut: ['1.2.3.4:99999'] }), 400, 'network.denyOut')

  const sbx = await create({ allowOut: [ONE], denyOut: [ALL_TRAFFIC] })
  await apiError(sbx.updateNetwork({ denyOut: ['example.com'] }), 400, 'network.denyOut')
  await apiError(
    sbx.updateNetwork({ allowOut: ['allowed.sbx.test'], rules: { 'allowed.sbx.test': [{ transform: { headers: { 'X-Compat': '1' } } }] } }),
    501,
    'network.rules',
  )
  // The failed updates left the policy as it was.
  assert.deepEqual(await policy(sbx), { allowOut: [ONE], denyOut: [ALL_TRAFFIC] })
  await refused(sbx, TWO, 80, 'http')
})

test('network: a sandbox created without internet access cannot be given rules (501)', O, async () => {
  const sbx = await create(undefined, { allowInternetAccess: false })
  await refused(sbx, ONE, 80, 'http')
  await apiError(sbx.updateNetwork({ allowOut: [ONE], denyOut: [ALL_TRAFFIC] }), 501, 'network')
})
