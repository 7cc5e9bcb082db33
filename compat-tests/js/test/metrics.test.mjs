// Metrics history and sandbox logs through the real e2b JS SDK against a
// real sandboxd: getMetrics({ start, end }) answers the samples sandboxd
// took periodically (run.sh starts it with --metrics-interval 1s), and the
// logs routes, which the SDK has no method for, answer through its own
// ApiClient. sandboxd mode only.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, ApiClient, ConnectionConfig, NotFoundError, CommandExitError } from 'e2b'
import { SANDBOXD, SANDBOXD_ONLY as S, waitFor } from './helpers.mjs'

let sbx
let createdAt
before(async () => {
  if (!SANDBOXD) return
  createdAt = new Date()
  sbx = await Sandbox.create({ timeoutMs: 300_000 })
})
after(async () => {
  if (sbx) await sbx.kill().catch(() => {})
})

test('metrics: getMetrics({ start, end }) returns the history, oldest first, in range', S, async () => {
  let ms = []
  await waitFor(async () => {
    ms = await sbx.getMetrics({ start: new Date(createdAt.getTime() - 1000), end: new Date() })
    return ms.length >= 3
  }, () => `3 samples, have ${JSON.stringify(ms)}`, 20_000)
  const lo = Math.floor(createdAt.getTime() / 1000) - 2
  const hi = Math.ceil(Date.now() / 1000) + 1
  for (let i = 0; i < ms.length; i++) {
    const t = ms[i].timestamp.getTime() / 1000
    assert.ok(t >= lo && t <= hi, `sample ${i} at ${t}, outside [${lo}, ${hi}]`)
    if (i > 0) assert.ok(ms[i].timestamp >= ms[i - 1].timestamp, `sample ${i} older than ${i - 1}`)
    for (const k of ['cpuUsedPct', 'cpuCount', 'memUsed', 'memTotal', 'memCache', 'diskUsed', 'diskTotal']) {
      assert.equal(typeof ms[i][k], 'number', `${k}: ${JSON.stringify(ms[i])}`)
    }
  }
  // Distinct moments: a history, not one sample repeated.
  assert.ok(new Set(ms.map((m) => m.timestamp.getTime())).size >= 3, JSON.stringify(ms))

  // A window that ends before the sandbox existed has no samples; one
  // from the newest sample on has the newest.
  assert.deepEqual(await sbx.getMetrics({ start: new Date(createdAt.getTime() - 3_600_000), end: new Date(createdAt.getTime() - 60_000) }), [])
  const newest = ms[ms.length - 1].timestamp
  const tail = await sbx.getMetrics({ start: new Date(Math.floor(newest.getTime() / 1000) * 1000) })
  assert.ok(tail.length >= 1 && tail.every((m) => m.timestamp.getTime() >= Math.floor(newest.getTime() / 1000) * 1000), JSON.stringify(tail))
  // The static form answers the same history.
  assert.ok((await Sandbox.getMetrics(sbx.sandboxId)).length >= ms.length)
})

test('metrics: the history grows with time', S, async () => {
  // Sampled every second (run.sh): a new sample comes within a few
  // passes, however slow the backend's stats are under load.
  const before = (await sbx.getMetrics()).length
  let now = before
  await waitFor(async () => (now = (await sbx.getMetrics()).length) >= before + 1, () => `a sample after the ${before} there were (${now} now)`, 20_000)
})

test('logs: the v2 route answers the lifecycle through the SDK client', S, async () => {
  await sbx.setTimeout(240_000)
  const client = new ApiClient(new ConnectionConfig())
  const get = (query) => client.api.GET('/v2/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: sbx.sandboxId }, query } })
  const res = await get({})
  assert.equal(res.response.status, 200, JSON.stringify(res.error))
  const logs = res.data.logs
  const msgs = logs.map((e) => e.message)
  assert.ok(msgs.includes('sandbox created') && msgs.includes('sandbox timeout set'), JSON.stringify(msgs))
  // Newest first by default.
  assert.equal(msgs[0], 'sandbox timeout set', JSON.stringify(msgs))
  for (const e of logs) {
    assert.ok(!Number.isNaN(new Date(e.timestamp).getTime()) && ['debug', 'info', 'warn', 'error'].includes(e.level), JSON.stringify(e))
    assert.equal(typeof e.fields, 'object')
  }
  // envd's own lines of the create come first; sandboxd's first is the create.
  const fwd = await get({ direction: 'forward', limit: 1, search: 'sandbox' })
  assert.deepEqual(fwd.data.logs.map((e) => [e.message, e.fields.action]), [['sandbox created', 'create']])
  const none = await get({ level: 'error' })
  assert.deepEqual(none.data.logs, [])

  const v1 = await client.api.GET('/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: sbx.sandboxId } } })
  assert.equal(v1.response.status, 200)
  assert.equal(v1.data.logs.length, v1.data.logEntries.length)
  // Each line is the raw JSON record (E2B's log pipeline's), as the e2b CLI parses it.
  const first = v1.data.logs.map((l) => JSON.parse(l.line)).find((r) => r.source === 'sandboxd')
  assert.equal(first.message, 'sandbox created')
  assert.equal(first.level, 'info')
  assert.equal(first.action, 'create')
  assert.equal(typeof first.logger, 'string')

  const missing = await client.api.GET('/v2/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: 'compatnosuchsandbox0' } } })
  assert.equal(missing.response.status, 404)
  assert.equal(missing.error.code, 404)
})

test("logs: envd's own lines about a command, through both routes", S, async () => {
  const client = new ApiClient(new ConnectionConfig())
  const id = sbx.sandboxId
  await assert.rejects(sbx.commands.run('echo compat-envd-log; exit 3'), (e) => e instanceof CommandExitError && e.exitCode === 3)

  // There at once: envd logs a command's end before it sends it, and a
  // logs request reads envd's new lines.
  const res = await client.api.GET('/v2/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: id }, query: { search: 'process', direction: 'forward' } } })
  const envd = res.data.logs.filter((e) => e.fields.source === 'envd')
  const started = envd.find((e) => e.message === 'process started' && (e.fields.args ?? '').includes('compat-envd-log'))
  const ended = started && envd.find((e) => e.message === 'process ended' && e.fields.pid === started.fields.pid)
  assert.ok(ended, JSON.stringify(envd))
  assert.equal(started.level, 'info')
  assert.equal(started.fields.cmd, '/bin/bash')
  assert.equal(started.fields.user, 'user')
  assert.ok(started.fields.cwd, JSON.stringify(started))
  assert.equal(ended.fields.exit_code, '3', JSON.stringify(ended))
  assert.ok(new Date(ended.timestamp) >= new Date(started.timestamp))

  // v1 from the start line's millisecond on: both, as raw records whose
  // logger is envd.
  const v1 = await client.api.GET('/sandboxes/{sandboxID}/logs', { params: { path: { sandboxID: id }, query: { start: new Date(started.timestamp).getTime() } } })
  const records = v1.data.logs.map((l) => JSON.parse(l.line))
  const pid = started.fields.pid
  assert.ok(records.some((r) => r.message === 'process started' && r.pid === pid && r.logger === 'envd' && r.level === 'info'), JSON.stringify(records))
  assert.ok(records.some((r) => r.message === 'process ended' && r.pid === pid && r.exit_code === '3'), JSON.stringify(records))
})

test('metrics: a killed sandbox has none', S, async () => {
  const s = await Sandbox.create({ timeoutMs: 60_000 })
  await s.kill()
  await assert.rejects(Sandbox.getMetrics(s.sandboxId), NotFoundError)
})
