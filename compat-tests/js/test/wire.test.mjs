// A few contract points of envd's Connect protocol that the SDKs rely
// on but that a short SDK test cannot reach: keepalive events at the interval
// the client asks for, the framing of server streams, the unary error shape.
// Raw Connect-JSON over plain fetch, exactly as the SDKs put it on the wire.
// In sandboxd mode the same frames go through sandboxd's data-plane proxy
// (routing headers + X-Access-Token, as the SDK sends them).
import { test, before } from 'node:test'
import assert from 'node:assert/strict'
import { ENVD_URL, T, newSandbox, envdHeaders, scratch, cleanup } from './helpers.mjs'

const USER = { Authorization: `Basic ${Buffer.from('user:').toString('base64')}` }
let sbx
let ROUTE = {} // envdHeaders(sbx): empty in debug mode
before(async () => {
  sbx = await newSandbox()
  ROUTE = envdHeaders(sbx)
})

function envelope(obj) {
  const body = Buffer.from(JSON.stringify(obj))
  const head = Buffer.alloc(5)
  head.writeUInt8(0, 0)
  head.writeUInt32BE(body.length, 1)
  return Buffer.concat([head, body])
}

/**
 * Opens a server stream and yields {flags, msg} per envelope until the end
 * frame (included) or until the caller stops iterating.
 */
async function* stream(method, req, headers = {}, signal) {
  const res = await fetch(`${ENVD_URL}/${method}`, {
    method: 'POST',
    body: envelope(req),
    headers: { 'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1', ...ROUTE, ...USER, ...headers },
    signal,
  })
  assert.equal(res.status, 200)
  assert.equal(res.headers.get('content-type'), 'application/connect+json')
  let buf = Buffer.alloc(0)
  for await (const chunk of res.body) {
    buf = Buffer.concat([buf, chunk])
    while (buf.length >= 5) {
      const len = buf.readUInt32BE(1)
      if (buf.length < 5 + len) break
      const flags = buf[0]
      const msg = JSON.parse(buf.subarray(5, 5 + len).toString() || '{}')
      buf = buf.subarray(5 + len)
      yield { flags, msg }
      if (flags & 2) return
    }
  }
  assert.fail('stream ended without an end-stream frame (flag 0x02)')
}

test('wire: Start streams start, data, end, then an empty end-stream frame', T, async () => {
  const frames = []
  for await (const f of stream('process.Process/Start', {
    process: { cmd: '/bin/bash', args: ['-l', '-c', 'echo hi; exit 2'], envs: {} },
    stdin: false,
  })) frames.push(f)
  assert.ok(frames[0].msg.event?.start?.pid > 0, `first frame: ${JSON.stringify(frames[0])}`)
  const data = frames.filter((f) => f.msg.event?.data).map((f) => Buffer.from(f.msg.event.data.stdout ?? '', 'base64')).join('')
  assert.equal(data, 'hi\n')
  const ends = frames.filter((f) => f.msg.event?.end)
  assert.equal(ends.length, 1)
  assert.equal(ends[0].msg.event.end.exitCode, 2)
  assert.equal(ends[0].msg.event.end.exited, true)
  const last = frames.at(-1)
  assert.equal(last.flags, 2)
  assert.deepEqual(last.msg, {})
})

test('wire: Start sends keepalive events at Keepalive-Ping-Interval', T, async () => {
  const ac = new AbortController()
  const started = Date.now()
  let pid
  let keepalives = 0
  try {
    for await (const f of stream(
      'process.Process/Start',
      { process: { cmd: '/bin/bash', args: ['-l', '-c', 'sleep 10'], envs: {} }, stdin: false },
      { 'Keepalive-Ping-Interval': '1', 'Connect-Timeout-Ms': '20000' },
      ac.signal,
    )) {
      if (f.msg.event?.start) pid = f.msg.event.start.pid
      if (f.msg.event?.keepalive) keepalives++
      if (keepalives >= 2) break
      if (Date.now() - started > 6000) break
    }
  } finally {
    ac.abort()
    if (pid) {
      await fetch(`${ENVD_URL}/process.Process/SendSignal`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1', ...ROUTE },
        body: JSON.stringify({ process: { pid }, signal: 'SIGNAL_SIGKILL' }),
      })
    }
  }
  assert.ok(keepalives >= 2, `got ${keepalives} keepalive(s) in ${Date.now() - started} ms with interval 1 s`)
})

test('wire: Connect-Timeout-Ms ends the stream with deadline_exceeded in the end frame', T, async () => {
  const frames = []
  for await (const f of stream(
    'process.Process/Start',
    { process: { cmd: '/bin/bash', args: ['-l', '-c', 'sleep 10'], envs: {} }, stdin: false },
    { 'Connect-Timeout-Ms': '700' },
  )) frames.push(f)
  const last = frames.at(-1)
  assert.equal(last.flags, 2)
  assert.equal(last.msg.error?.code, 'deadline_exceeded', JSON.stringify(last.msg))
})

test('wire: WatchDir starts with {"start":{}} and sends keepalives', T, async () => {
  // An empty directory: events reset the keepalive timer.
  const dir = scratch('wire')
  await sbx.files.makeDir(dir)
  const ac = new AbortController()
  const frames = []
  const started = Date.now()
  try {
    for await (const f of stream('filesystem.Filesystem/WatchDir', { path: dir, recursive: false }, { 'Keepalive-Ping-Interval': '1' }, ac.signal)) {
      frames.push(f)
      if (frames.filter((x) => x.msg.keepalive).length >= 2 || Date.now() - started > 6000) break
    }
  } finally {
    ac.abort()
    await cleanup(sbx, dir)
  }
  assert.deepEqual(frames[0].msg, { start: {} })
  assert.ok(frames.filter((x) => x.msg.keepalive).length >= 2, JSON.stringify(frames.map((f) => f.msg)))
})

test('wire: unary errors are JSON {code, message} with the Connect HTTP status', T, async () => {
  const r = await fetch(`${ENVD_URL}/filesystem.Filesystem/Stat`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1', ...ROUTE, ...USER },
    body: JSON.stringify({ path: '/no/such/path/compat' }),
  })
  assert.equal(r.status, 404)
  assert.match(r.headers.get('content-type'), /^application\/json/)
  const body = await r.json()
  assert.equal(body.code, 'not_found')
  assert.equal(typeof body.message, 'string')
  const u = await fetch(`${ENVD_URL}/filesystem.Filesystem/Stat`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1', ...ROUTE, Authorization: `Basic ${Buffer.from('no-such-user-compat:').toString('base64')}` },
    body: JSON.stringify({ path: '/tmp' }),
  })
  assert.equal(u.status, 401)
  assert.equal((await u.json()).code, 'unauthenticated')
})

test('wire: Stat returns proto3 JSON (int64 size as string, enum names, RFC 3339 time)', T, async () => {
  const r = await fetch(`${ENVD_URL}/filesystem.Filesystem/Stat`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1', ...ROUTE, ...USER },
    body: JSON.stringify({ path: '/etc/hostname' }),
  })
  assert.equal(r.status, 200)
  const { entry } = await r.json()
  assert.equal(entry.type, 'FILE_TYPE_FILE')
  assert.equal(typeof entry.size, 'string')
  assert.match(entry.modifiedTime, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$/)
  assert.equal(entry.path, '/etc/hostname')
})
