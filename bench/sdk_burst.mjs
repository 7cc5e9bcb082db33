// The JS twin of sdk_burst.py: N concurrent Sandbox.create() →
// commands.run('true') → kill() with E2B's JS SDK, then THEN more one after
// another; the same output (one JSON object per line).
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

async function one (t0burst) {
  let sbx
  let rec = { kind: 'item' }
  try {
    const t0 = now()
    sbx = await Sandbox.create({ timeoutMs: 600_000 })
    rec.create_ms = ms(t0)
    const t1 = now()
    await sbx.commands.run('true')
    rec.first_run_ms = ms(t1)
    rec.total_ms = ms(t0)
    rec.done_at_ms = ms(t0burst)
  } catch (e) {
    rec = { kind: 'error', error: `${e?.name}: ${e?.message}` }
  }
  if (sbx) await sbx.kill().catch(() => {})
  return rec
}

const t0 = now()
const burst = await Promise.all(Array.from({ length: n }, () => one(t0)))
for (const rec of burst) process.stdout.write(JSON.stringify(rec) + '\n')
const done = burst.filter((r) => r.kind === 'item').map((r) => r.done_at_ms)
process.stdout.write(JSON.stringify({ kind: 'wall', ms: done.length ? Math.max(...done) : null }) + '\n')
for (let i = 0; i < then; i++) {
  const rec = await one(now())
  process.stdout.write(JSON.stringify(rec.kind === 'item' ? { kind: 'seq', total_ms: rec.total_ms } : rec) + '\n')
}
