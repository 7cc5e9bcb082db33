// SDK-observed timings with E2B's JS SDK against sandboxd: the JS twin of
// sdk_bench.py, with the same output (one JSON object per line).
//
// usage: node sdk_bench.mjs ITERATIONS RUNS_PER_SANDBOX [DIRECT_ENVD_URL]
// E2B_JS_SDK must name the SDK's ESM entry point (the Go driver sets it to
// compat-tests/js/node_modules/e2b/dist/index.mjs).

for (const v of ['E2B_DEBUG', 'E2B_DOMAIN', 'E2B_ACCESS_TOKEN']) delete process.env[v]
if (!process.env.E2B_API_URL?.startsWith('http://127.0.0.1:') || !process.env.E2B_SANDBOX_URL?.startsWith('http://127.0.0.1:')) {
  throw new Error('E2B_API_URL and E2B_SANDBOX_URL must point at loopback')
}
const { Sandbox } = await import(process.env.E2B_JS_SDK)

const [iterations, runs] = [Number(process.argv[2]), Number(process.argv[3])]
const direct = process.argv[4] || ''
const ms = (t0) => Number(process.hrtime.bigint() - t0) / 1e6
const now = () => process.hrtime.bigint()

for (let i = 0; i <= iterations; i++) { // the first one warms the module and pools
  let out = { kind: 'iter', warmup: i === 0 }
  let sbx
  try {
    let t0 = now()
    sbx = await Sandbox.create({ timeoutMs: 600_000 })
    out.create_ms = ms(t0)
    t0 = now()
    await sbx.commands.run('true')
    out.first_run_ms = ms(t0)
    out.runs_ms = []
    for (let j = 0; j < runs; j++) {
      t0 = now()
      await sbx.commands.run('true')
      out.runs_ms.push(ms(t0))
    }
    if (direct) {
      const d = await Sandbox.connect(sbx.sandboxId, { sandboxUrl: direct })
      out.direct_runs_ms = []
      for (let j = 0; j < runs; j++) {
        t0 = now()
        await d.commands.run('true')
        out.direct_runs_ms.push(ms(t0))
      }
    }
    t0 = now()
    await sbx.kill()
    out.kill_ms = ms(t0)
    sbx = undefined
  } catch (e) {
    out = { kind: 'error', error: `${e?.name}: ${e?.message}` }
    if (sbx) await sbx.kill().catch(() => {})
  }
  process.stdout.write(JSON.stringify(out) + '\n')
}
