// The JS twin of sdk_burst.py: N concurrent Sandbox.create() →
// commands.run('true') → kill() with E2B's JS SDK, then THEN more one after
// another; the same output (one JSON object per line), BURST_CREATES_FIRST=1
// included (the burst's commands and kills wait until every create has
// returned; a "created" line says when, and the process's CPU by then).
//
// usage: node sdk_burst.mjs N [THEN]
// E2B_JS_SDK must name the SDK's ESM entry point (the Go driver sets it).

for (const v of ['E2B_DEBUG', 'E2B_DOMAIN', 'E2B_ACCESS_TOKEN']) delete process.env[v]
if (!process.env.E2B_API_URL?.startsWith('http://127.0.0.1:') || !process.env.E2B_SANDBOX_URL?.startsWith('http://127.0.0.1:')) {
  throw new Error('E2B_API_URL and E2B_SANDBOX_URL must point at loopback')
}
const { Sandbox } = await import(process.env.E2B_JS_SDK)

const [n, then] = [Number(process.argv[2]), Number(process.argv[3] || 0)]
const ms = (t0) => Number(process.hrtime.bigint() - t0) / 1e6
const now = () => process.hrtime.bigint()

async function create1 () {
  const t0 = now()
  try {
    const sbx = await Sandbox.create({ timeoutMs: 600_000 })
    return { sbx, t0, createMs: ms(t0) }
  } catch (e) {
    return { t0, err: e }
  }
}

async function finish (c, t0burst) {
  let rec = { kind: 'item' }
  if (c.err) return { kind: 'error', error: `${c.err?.name}: ${c.err?.message}` }
  try {
    rec.create_ms = c.createMs
    const t1 = now()
    await c.sbx.commands.run('true')
    rec.first_run_ms = ms(t1)
    rec.total_ms = ms(c.t0)
    rec.done_at_ms = ms(t0burst)
  } catch (e) {
    rec = { kind: 'error', error: `${e?.name}: ${e?.message}` }
  }
  await c.sbx.kill().catch(() => {})
  return rec
}

const one = async (t0burst) => finish(await create1(), t0burst)

const t0 = now()
let burst, created
if (process.env.BURST_CREATES_FIRST === '1') {
  const cs = await Promise.all(Array.from({ length: n }, () => create1()))
  const cpu = process.cpuUsage()
  created = { kind: 'created', ms: ms(t0), cpu_s: (cpu.user + cpu.system) / 1e6 }
  burst = await Promise.all(cs.map((c) => finish(c, t0)))
} else {
  burst = await Promise.all(Array.from({ length: n }, () => one(t0)))
}
for (const rec of burst) process.stdout.write(JSON.stringify(rec) + '\n')
const done = burst.filter((r) => r.kind === 'item').map((r) => r.done_at_ms)
process.stdout.write(JSON.stringify({ kind: 'wall', ms: done.length ? Math.max(...done) : null }) + '\n')
if (created) process.stdout.write(JSON.stringify(created) + '\n')
for (let i = 0; i < then; i++) {
  const rec = await one(now())
  process.stdout.write(JSON.stringify(rec.kind === 'item' ? { kind: 'seq', total_ms: rec.total_ms } : rec) + '\n')
}
