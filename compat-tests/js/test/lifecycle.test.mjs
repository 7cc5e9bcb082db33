// Sandbox lifecycle through the real e2b JS SDK against a real sandboxd
// (control plane REST API + data-plane proxy): create/getInfo/list/connect/
// setTimeout/kill/getMetrics/pause/resume, the port proxy, the secure
// sandbox's access token, signed URLs, concurrency, timeouts, and API errors.
// sandboxd mode only (COMPAT_TARGET=sandboxd); every test is skipped in debug
// mode, where there is no control plane.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import http from 'node:http'
import { Sandbox, AuthenticationError, SandboxError, NotFoundError, CommandExitError } from 'e2b'
import { SANDBOXD, DOMAIN_MODE, BACKEND, SANDBOXD_ONLY as S, ENVD_URL, HOME, envdHeaders, rawConnect, sleep, waitFor } from './helpers.mjs'

const RUN = randomBytes(4).toString('hex') // this file's metadata tag
const made = new Set() // every sandbox this file created; killed in after()

async function create(opts = {}) {
  const sbx = await Sandbox.create({ timeoutMs: 300_000, ...opts, metadata: { compatRun: RUN, ...opts.metadata } })
  made.add(sbx.sandboxId)
  return sbx
}

async function listAll(opts) {
  const p = Sandbox.list(opts)
  const out = []
  while (p.hasNext) out.push(...(await p.nextItems()))
  return out
}

/** Resolves true once the API no longer lists sandboxId. */
async function gone(sandboxId) {
  return !(await listAll({ query: { metadata: { compatRun: RUN } } })).some((s) => s.sandboxId === sandboxId)
}

let sbx // the main sandbox: metadata + envs
before(async () => {
  if (!SANDBOXD) return
  sbx = await create({ metadata: { role: 'main' }, envs: { COMPAT_ENV: 'from-create', COMPAT_OTHER: 'x' } })
})
after(async () => {
  if (!SANDBOXD) return
  for (const id of made) await Sandbox.kill(id).catch(() => {})
})

test('lifecycle: create returns a sandbox id and a secure envd', S, async () => {
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/)
  assert.notEqual(sbx.sandboxId, 'debug_sandbox_id')
  assert.ok(sbx.envdAccessToken, 'sandboxd must return envdAccessToken (v2 creates are secure)')
  assert.equal(await sbx.isRunning(), true)
})

test('lifecycle: envs given at create are visible in commands; per-command envs win', S, async () => {
  assert.equal((await sbx.commands.run('echo $COMPAT_ENV $COMPAT_OTHER')).stdout, 'from-create x\n')
  assert.equal((await sbx.commands.run('echo $COMPAT_ENV', { user: 'root' })).stdout, 'from-create\n')
  const r = await sbx.commands.run('echo $COMPAT_ENV', { envs: { COMPAT_ENV: 'per-command' } })
  assert.equal(r.stdout, 'per-command\n')
})

test('lifecycle: getInfo fields', S, async () => {
  const before = Date.now()
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.templateId, 'base')
  assert.deepEqual(info.metadata, { compatRun: RUN, role: 'main' })
  assert.equal(info.state, 'running')
  assert.ok(info.startedAt instanceof Date && info.endAt instanceof Date)
  assert.ok(info.startedAt.getTime() <= before + 1000, `startedAt ${info.startedAt.toISOString()} is in the future`)
  const ttl = info.endAt.getTime() - info.startedAt.getTime()
  assert.ok(Math.abs(ttl - 300_000) < 5_000, `endAt - startedAt = ${ttl} ms, want ~300 s`)
  assert.ok(Number.isInteger(info.cpuCount) && info.cpuCount >= 1, `cpuCount ${info.cpuCount}`)
  assert.ok(Number.isInteger(info.memoryMB) && info.memoryMB > 0, `memoryMB ${info.memoryMB}`)
  assert.match(info.envdVersion, /^\d+\.\d+\.\d+/)
  // The static form answers the same.
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).sandboxId, sbx.sandboxId)
})

test('lifecycle: getMetrics returns well-formed samples', S, async () => {
  const ms = await sbx.getMetrics()
  assert.ok(Array.isArray(ms), JSON.stringify(ms))
  assert.ok(ms.length >= 1, 'no metrics sample')
  for (const m of ms) {
    assert.ok(m.timestamp instanceof Date && !Number.isNaN(m.timestamp.getTime()), `timestamp ${m.timestamp}`)
    for (const k of ['cpuUsedPct', 'cpuCount', 'memUsed', 'memTotal', 'memCache', 'diskUsed', 'diskTotal']) {
      assert.equal(typeof m[k], 'number', `${k}: ${JSON.stringify(m)}`)
      assert.ok(m[k] >= 0, `${k} < 0: ${JSON.stringify(m)}`)
    }
    assert.ok(m.cpuCount >= 1 && m.memTotal > 0, JSON.stringify(m))
  }
  assert.ok(Array.isArray(await Sandbox.getMetrics(sbx.sandboxId)))
})

test('lifecycle: getMetrics reflects load: CPU busy loop, memory, disk', { ...S, timeout: 45_000 }, async () => {
  const s = await create({ metadata: { role: 'metrics' } })
  try {
    await s.commands.run('head -c 20000000 /dev/urandom > ~/compat-metrics.bin')
    // Two busy loops, one a CPU each (the default cpuCount is 2): with
    // one, a host kept busy by other work (CI's emulated VMs) gave it
    // 10-19 % of the sandbox's CPUs, under the bar below.
    const busy = await s.commands.run(
      `spin='import time; t = time.time()
while time.time() - t < 12: pass'
python3 -c "x = bytearray(150 * 1024 * 1024); $spin" & python3 -c "$spin"; wait`,
      { background: true, timeoutMs: 30_000 },
    )
    const seen = []
    let mem = 0
    let disk = 0
    let cpu = 0
    const deadline = Date.now() + 10_000
    while (Date.now() < deadline && !(cpu > 20 && mem > 100e6 && disk > 15e6)) {
      await sleep(1_000)
      const [m] = (await s.getMetrics()).slice(-1)
      seen.push({ cpuUsedPct: m.cpuUsedPct, memUsed: m.memUsed, diskUsed: m.diskUsed })
      cpu = Math.max(cpu, m.cpuUsedPct)
      mem = Math.max(mem, m.memUsed)
      disk = Math.max(disk, m.diskUsed)
    }
    await busy.kill()
    assert.ok(mem > 100e6, `memUsed never showed the 150 MB allocation: ${JSON.stringify(seen)}`)
    assert.ok(disk > 15e6, `diskUsed never showed the 20 MB file: ${JSON.stringify(seen)}`)
    assert.ok(cpu > 20, `cpuUsedPct stayed <= 20 with two busy loops: ${JSON.stringify(seen)}`)
  } finally {
    await s.kill()
  }
})

test('lifecycle: connect by id from a second Sandbox object', S, async () => {
  await sbx.files.write(`${HOME}/compat-connect.txt`, 'shared')
  const other = await Sandbox.connect(sbx.sandboxId)
  assert.equal(other.sandboxId, sbx.sandboxId)
  assert.equal(await other.files.read(`${HOME}/compat-connect.txt`), 'shared')
  assert.equal((await other.commands.run('echo $COMPAT_ENV')).stdout, 'from-create\n')
  // connect never shortens the timeout
  const info = await other.getInfo()
  assert.ok(info.endAt.getTime() - Date.now() > 250_000, `endAt ${info.endAt.toISOString()}`)
})

test('lifecycle: list filters by metadata and state', S, async () => {
  const tag = randomBytes(3).toString('hex')
  const a = await create({ metadata: { listTag: tag, which: 'a' } })
  const b = await create({ metadata: { listTag: tag, which: 'b' } })
  try {
    const both = await listAll({ query: { metadata: { listTag: tag } } })
    assert.deepEqual(both.map((s) => s.sandboxId).sort(), [a.sandboxId, b.sandboxId].sort())
    const onlyA = await listAll({ query: { metadata: { listTag: tag, which: 'a' } } })
    assert.deepEqual(onlyA.map((s) => s.sandboxId), [a.sandboxId])
    assert.deepEqual(onlyA[0].metadata, { compatRun: RUN, listTag: tag, which: 'a' })
    assert.equal(onlyA[0].state, 'running')
    assert.equal(onlyA[0].templateId, 'base')
    assert.ok(onlyA[0].startedAt instanceof Date)

    assert.equal(await b.pause(), true)
    const paused = await listAll({ query: { metadata: { listTag: tag }, state: ['paused'] } })
    assert.deepEqual(paused.map((s) => [s.sandboxId, s.state]), [[b.sandboxId, 'paused']])
    const running = await listAll({ query: { metadata: { listTag: tag }, state: ['running'] } })
    assert.deepEqual(running.map((s) => [s.sandboxId, s.state]), [[a.sandboxId, 'running']])
    const none = await listAll({ query: { metadata: { listTag: tag, which: 'nope' } } })
    assert.deepEqual(none, [])
  } finally {
    await a.kill()
    await Sandbox.kill(b.sandboxId)
  }
})

test('lifecycle: list pages with limit (paginator over 3 sandboxes)', S, async () => {
  const tag = randomBytes(3).toString('hex')
  const sbxs = []
  for (let i = 0; i < 3; i++) sbxs.push(await create({ metadata: { pageTag: tag } }))
  try {
    const p = Sandbox.list({ query: { metadata: { pageTag: tag } }, limit: 2 })
    assert.equal(p.hasNext, true)
    const first = await p.nextItems()
    assert.equal(first.length, 2)
    assert.equal(p.hasNext, true, 'a second page must follow')
    assert.ok(p.nextToken, 'nextToken after the first page')
    const second = await p.nextItems()
    assert.equal(second.length, 1)
    assert.equal(p.hasNext, false)
    await assert.rejects(p.nextItems())
    const ids = [...first, ...second].map((s) => s.sandboxId)
    assert.equal(new Set(ids).size, 3, `duplicates across pages: ${ids}`)
    assert.deepEqual(ids.sort(), sbxs.map((s) => s.sandboxId).sort())
    // newest first by default (E2B orders by start time, desc)
    const desc = await listAll({ query: { metadata: { pageTag: tag } }, limit: 1 })
    assert.deepEqual(desc.map((s) => s.sandboxId), sbxs.map((s) => s.sandboxId).reverse())
  } finally {
    for (const s of sbxs) await s.kill()
  }
})

test('lifecycle: list: metadata with reserved characters, template filter, order asc', S, async () => {
  const tag = randomBytes(3).toString('hex')
  const md = { 'odd key': 'a&b=c/d?e%f+g ü', tag }
  const a = await create({ metadata: md })
  const b = await create({ metadata: { tag } })
  try {
    const hit = await listAll({ query: { metadata: { 'odd key': 'a&b=c/d?e%f+g ü' } } })
    assert.deepEqual(hit.map((s) => s.sandboxId), [a.sandboxId])
    assert.deepEqual(hit[0].metadata, { compatRun: RUN, ...md })
    assert.deepEqual(await listAll({ query: { metadata: { 'odd key': 'a&b=c' } } }), [])
    const base = await listAll({ query: { metadata: { tag }, template: 'base' } })
    assert.equal(base.length, 2)
    assert.deepEqual(await listAll({ query: { metadata: { tag }, template: 'compat-no-such-template' } }), [])
    const asc = await listAll({ query: { metadata: { tag } }, order: 'asc' })
    assert.deepEqual(asc.map((s) => s.sandboxId), [a.sandboxId, b.sandboxId])
    const later = await listAll({ query: { metadata: { tag }, startedAfter: new Date(Date.now() + 60_000) } })
    assert.deepEqual(later, [])
  } finally {
    await a.kill()
    await b.kill()
  }
})

test('lifecycle: connect({timeoutMs}) extends the timeout, never shortens it', S, async () => {
  const s = await create({ timeoutMs: 60_000 })
  try {
    await Sandbox.connect(s.sandboxId, { timeoutMs: 600_000 })
    let left = (await s.getInfo()).endAt.getTime() - Date.now()
    assert.ok(left > 590_000 && left <= 605_000, `endAt - now = ${left} ms after connect(600 s)`)
    await Sandbox.connect(s.sandboxId, { timeoutMs: 10_000 })
    left = (await s.getInfo()).endAt.getTime() - Date.now()
    assert.ok(left > 580_000, `connect(10 s) shortened the timeout to ${left} ms`)
  } finally {
    await s.kill()
  }
})

test('lifecycle: onTimeout pause: the sandbox pauses at its timeout; traffic auto-resumes it', S, async () => {
  const s = await create({ timeoutMs: 3_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  try {
    await s.files.write(`${HOME}/compat-autopause.txt`, 'kept')
    const info = await s.getInfo()
    assert.deepEqual(info.lifecycle, { onTimeout: 'pause', autoResume: true })
    let state
    await waitFor(async () => (state = (await s.getInfo()).state) === 'paused', () => `state paused (is ${state})`, 15_000)
    assert.equal((await listAll({ query: { metadata: { compatRun: RUN }, state: ['paused'] } })).some((x) => x.sandboxId === s.sandboxId), true)
    // autoResume: envd traffic through the proxy resumes the sandbox.
    assert.equal(await s.files.read(`${HOME}/compat-autopause.txt`), 'kept')
    assert.equal((await s.getInfo()).state, 'running')
  } finally {
    await s.kill()
  }
})

test('lifecycle: a paused sandbox does not expire at its timeout; connect resumes it later', S, async () => {
  const s = await create({ timeoutMs: 3_000 })
  try {
    await s.files.write(`${HOME}/compat-paused-ttl.txt`, 'still here')
    assert.equal(await s.pause(), true)
    await sleep(5_000)
    assert.equal((await s.getInfo()).state, 'paused')
    const r = await Sandbox.connect(s.sandboxId, { timeoutMs: 60_000 })
    assert.equal(await r.files.read(`${HOME}/compat-paused-ttl.txt`), 'still here')
    const left = (await r.getInfo()).endAt.getTime() - Date.now()
    assert.ok(left > 50_000, `after resume endAt - now = ${left} ms, want ~60 s`)
  } finally {
    await s.kill()
  }
})

test('lifecycle: an auto-resume restarts the create timeout; the paused time does not count', S, async () => {
  // As in E2B (autoResume.timeout is the create's timeout): after the
  // auto-resume endAt is now + 30 s, not what was left at the pause (~20 s
  // here) nor the server's default (300 s).
  const s = await create({ timeoutMs: 30_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
  try {
    await s.files.write(`${HOME}/compat-resume-ttl.txt`, 'kept')
    assert.equal(await s.pause(), true)
    await sleep(10_000)
    assert.equal((await s.getInfo()).state, 'paused')
    assert.equal(await s.files.read(`${HOME}/compat-resume-ttl.txt`), 'kept') // auto-resumes it
    const info = await s.getInfo()
    assert.equal(info.state, 'running')
    const left = info.endAt.getTime() - Date.now()
    assert.ok(left > 25_000 && left <= 31_000, `after the auto-resume endAt - now = ${left} ms, want ~30 s`)
  } finally {
    await s.kill()
  }
})

test('lifecycle: auto-resume wakes a paused sandbox on an HTTP request to its port', { ...S, timeout: 60_000 }, async () => {
  // E2B's "auto-resume wakes paused sandbox on http request". The pause is
  // the SDK's default, in memory (keepMemory: true): the http.server is
  // frozen with the sandbox and answers again once the request through the
  // proxy has resumed it. (E2B refuses to auto-resume a filesystem-only
  // pause, whose processes are gone.)
  const s = await create({ lifecycle: { onTimeout: 'pause', autoResume: true } })
  try {
    const dir = `${HOME}/compat-wake-${RUN}`
    await s.files.write(`${dir}/hello.txt`, 'woken')
    await s.commands.run('python3 -m http.server 8000 --bind 0.0.0.0', { background: true, cwd: dir, timeoutMs: 0 })
    const get = DOMAIN_MODE
      ? () => fetch(`https://${s.getHost(8000)}/hello.txt`)
      : () => fetch(`${ENVD_URL}/hello.txt`, { headers: { 'E2b-Sandbox-Id': s.sandboxId, 'E2b-Sandbox-Port': '8000' } })
    let res
    await waitFor(async () => (res = await get()).status === 200, () => `http.server to answer (last status ${res?.status})`, 15_000)
    assert.equal(await s.pause(), true)
    assert.equal((await s.getInfo()).state, 'paused')
    res = await get() // the one request: it resumes the sandbox and is answered
    assert.equal(`${res.status} ${await res.text()}`, '200 woken')
    assert.equal((await s.getInfo()).state, 'running')
  } finally {
    await s.kill()
  }
})

test('lifecycle: pause({ keepMemory: false }) keeps files, ends processes; connect restarts it with its envs', S, async () => {
  const s = await create({ envs: { COMPAT_FS_PAUSE: 'kept' } })
  try {
    await s.files.write(`${HOME}/compat-fs-pause.txt`, 'before pause')
    await s.commands.run('sleep 600', { background: true })
    assert.equal(await s.pause({ keepMemory: false }), true)
    assert.equal((await s.getInfo()).state, 'paused')
    const r = await Sandbox.connect(s.sandboxId)
    assert.equal(await r.files.read(`${HOME}/compat-fs-pause.txt`), 'before pause')
    const procs = await r.commands.list()
    assert.ok(!procs.some((p) => [p.cmd, ...p.args].join(' ').includes('sleep 600')), JSON.stringify(procs))
    assert.equal((await r.commands.run('echo $COMPAT_FS_PAUSE')).stdout, 'kept\n')
  } finally {
    await s.kill()
  }
})

test('lifecycle: kill of a paused sandbox', S, async () => {
  const s = await create()
  assert.equal(await s.pause(), true)
  assert.equal(await s.kill(), true)
  assert.equal(await gone(s.sandboxId), true)
  await assert.rejects(Sandbox.connect(s.sandboxId), NotFoundError)
})

test('lifecycle: setTimeout moves endAt; a short timeout ends the sandbox', S, async () => {
  const s = await create()
  try {
    await s.setTimeout(120_000)
    let info = await s.getInfo()
    let left = info.endAt.getTime() - Date.now()
    assert.ok(left > 110_000 && left <= 125_000, `endAt - now = ${left} ms after setTimeout(120 s)`)
    // setTimeout may also shorten (it overwrites the TTL from now).
    await Sandbox.setTimeout(s.sandboxId, 2_000)
    info = await s.getInfo()
    left = info.endAt.getTime() - Date.now()
    assert.ok(left <= 3_000, `endAt - now = ${left} ms after setTimeout(2 s)`)
    await waitFor(() => gone(s.sandboxId), 'the sandbox to end after setTimeout(2 s)', 15_000)
    assert.equal(await s.isRunning(), false)
  } finally {
    await s.kill().catch(() => {})
  }
})

test('lifecycle: a sandbox created with a 3 s timeout is gone after a bounded wait', S, async () => {
  const s = await create({ timeoutMs: 3_000 })
  const t0 = Date.now()
  assert.equal((await s.commands.run('echo alive')).stdout, 'alive\n')
  await waitFor(() => gone(s.sandboxId), 'the 3 s sandbox to disappear from list', 15_000)
  assert.ok(Date.now() - t0 >= 2_000, 'ended before its timeout')
  assert.equal(await s.isRunning(), false)
  await assert.rejects(s.getInfo(), NotFoundError)
  assert.equal(await s.kill(), false)
})

test('lifecycle: kill → isRunning false, not listed, getInfo NotFound, second kill false', S, async () => {
  const s = await create()
  assert.equal(await s.isRunning(), true)
  assert.equal(await s.kill(), true)
  assert.equal(await s.isRunning(), false)
  assert.equal(await gone(s.sandboxId), true)
  await assert.rejects(s.getInfo(), NotFoundError)
  assert.equal(await Sandbox.kill(s.sandboxId), false)
  // The proxy answers 502 "The sandbox was not found" for a dead sandbox.
  const r = await fetch(`${ENVD_URL}/health`, { headers: envdHeaders(s, { token: false }) })
  assert.equal(r.status, 502)
  assert.match(await r.text(), /The sandbox was not found/)
})

test('lifecycle: a sandbox killed while a command streams ends the command with an error', S, async () => {
  const s = await create()
  const started = Date.now()
  const run = s.commands.run('echo started; sleep 60', { timeoutMs: 0 })
  // an unhandled rejection must not escape before assert.rejects attaches
  run.catch(() => {})
  await sleep(500)
  assert.equal(await s.kill(), true)
  await assert.rejects(run, (e) => {
    assert.ok(e instanceof Error, String(e))
    return true
  })
  assert.ok(Date.now() - started < 15_000, `the command took ${Date.now() - started} ms to fail after kill`)
})

// sandboxd's local backend keeps the disk in RAM and charges it to the
// sandbox's memory cgroup, so the kernel-enforced budget is memory + disk
// (README): a process allocating more than that is OOM-killed.
test('lifecycle: a process over the memory budget is OOM-killed; the sandbox survives', S, async () => {
  const s = await create()
  try {
    const { memoryMB } = await s.getInfo()
    const diskSizeMB = Math.round((await s.getMetrics()).at(-1).diskTotal / 2 ** 20)
    await assert.rejects(
      s.commands.run(`python3 -c 'x = bytearray(${memoryMB + diskSizeMB + 200} * 1024 * 1024)'`),
      (e) => e instanceof CommandExitError && e.exitCode !== 0,
    )
    assert.equal((await s.commands.run('echo alive')).stdout, 'alive\n')
  } finally {
    await s.kill()
  }
})

test('lifecycle: filling the disk gives ENOSPC, the sandbox survives, and the API agrees with the data plane', S, async () => {
  const s = await create()
  try {
    const { memoryMB } = await s.getInfo()
    const m = (await s.getMetrics()).at(-1)
    const diskMB = Math.round(m.diskTotal / 2 ** 20)
    // Write past the advertised disk size (and past the memory limit).
    const dd = await s.commands
      .run(`dd if=/dev/zero of=/home/user/compat-fill bs=1M count=${diskMB + 100} 2>&1 | tail -n 4`, { user: 'root', timeoutMs: 60_000 })
      .then((r) => `exit ${r.exitCode}: ${r.stdout}`, (e) => `${e?.constructor?.name}: ${e?.message}`)
    const alive = await s.isRunning()
    if (!alive) {
      // The data plane says dead: the control plane must stop saying running.
      let state
      try {
        await waitFor(async () => {
          try {
            state = (await s.getInfo()).state
          } catch (e) {
            state = `gone (${e?.constructor?.name})`
          }
          return state !== 'running'
        }, 'x', 5_000)
      } catch {}
      assert.fail(
        `the sandbox died writing ${diskMB + 100} MiB to its ${diskMB} MiB disk (memoryMB ${memoryMB}); ` +
          `dd: ${dd.trim()}; isRunning() false; 5 s later getInfo().state = ${state}`,
      )
    }
    // Incus's btrfs quota stops the write with EDQUOT instead (README.md).
    assert.match(dd, BACKEND === 'incus' ? /No space left on device|Disk quota exceeded/ : /No space left on device/, dd)
    await assert.rejects(s.files.write('/home/user/compat-more.bin', new Uint8Array(4 << 20)), (e) => e instanceof SandboxError)
    await s.commands.run('rm -f /home/user/compat-fill', { user: 'root' })
    await s.files.write('/home/user/compat-more.bin', 'fits again')
  } finally {
    await s.kill()
  }
})

test('lifecycle: unknown id: kill returns false; connect/getInfo/setTimeout/getMetrics/pause are NotFound', S, async () => {
  assert.equal(await Sandbox.kill('compatnosuchsandbox0'), false)
  await assert.rejects(Sandbox.connect('compatnosuchsandbox0'), NotFoundError)
  await assert.rejects(Sandbox.getInfo('compatnosuchsandbox0'), NotFoundError)
  await assert.rejects(Sandbox.setTimeout('compatnosuchsandbox0', 10_000), NotFoundError)
  await assert.rejects(Sandbox.getMetrics('compatnosuchsandbox0'), NotFoundError)
  await assert.rejects(Sandbox.pause('compatnosuchsandbox0'), NotFoundError)
})

test('lifecycle: pause → paused → connect resumes, files and processes survive', S, async () => {
  const s = await create({ metadata: { role: 'pause' } })
  try {
    await s.files.write(`${HOME}/compat-pause.txt`, 'before pause')
    const bg = await s.commands.run('sleep 600', { background: true })
    assert.equal(await s.pause(), true)
    assert.equal((await s.getInfo()).state, 'paused')
    assert.equal(await s.isRunning(), false)
    assert.equal(await s.pause(), false, 'pausing a paused sandbox returns false (409)')

    const resumed = await Sandbox.connect(s.sandboxId)
    assert.equal((await resumed.getInfo()).state, 'running')
    assert.equal(await resumed.isRunning(), true)
    assert.equal(await resumed.files.read(`${HOME}/compat-pause.txt`), 'before pause')
    const procs = await resumed.commands.list()
    assert.ok(procs.some((p) => p.pid === bg.pid), `pid ${bg.pid} not listed after resume: ${JSON.stringify(procs)}`)
    // The process survived: reattach to it and kill it.
    const again = await resumed.commands.connect(bg.pid)
    assert.equal(await resumed.commands.kill(bg.pid), true)
    await assert.rejects(again.wait(), (e) => e.exitCode === -1 || /killed/.test(e.message))
    // betaPause is the same call; connect() on the old object resumes too.
    assert.equal(await resumed.betaPause(), true)
    await s.connect()
    assert.equal((await s.commands.run('cat ~/compat-pause.txt')).stdout, 'before pause')
  } finally {
    await s.kill()
  }
})

test('lifecycle: port proxy by E2b-Sandbox-Id / E2b-Sandbox-Port headers', S, async () => {
  // getHost(8000) is `8000-<id>.<domain>`, which needs wildcard DNS; the same
  // proxy also routes plain requests by the routing headers, tested here.
  assert.match(sbx.getHost(8000), new RegExp(`^8000-${sbx.sandboxId}\\.`))
  const dir = `${HOME}/compat-http-${RUN}`
  await sbx.files.write(`${dir}/hello.txt`, 'hello through the proxy')
  const route = { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8000' }
  const closed = await fetch(`${ENVD_URL}/`, { headers: route })
  assert.equal(closed.status, 502)
  assert.match(await closed.text(), /port is not open/)
  const server = await sbx.commands.run('python3 -m http.server 8000 --bind 0.0.0.0', { background: true, cwd: dir, timeoutMs: 0 })
  try {
    let res
    await waitFor(async () => {
      res = await fetch(`${ENVD_URL}/hello.txt`, { headers: route })
      return res.status === 200
    }, () => `http.server to answer through the proxy (last status ${res?.status})`, 15_000)
    assert.equal(await res.text(), 'hello through the proxy')
    const listing = await fetch(`${ENVD_URL}/`, { headers: route })
    assert.equal(listing.status, 200)
    assert.match(await listing.text(), /hello\.txt/)
    // No access token is needed for ports other than envd's.
    assert.equal((await fetch(`${ENVD_URL}/nope`, { headers: route })).status, 404)
  } finally {
    await server.kill()
    await sbx.files.remove(dir)
  }
})

// A tiny HTTP server for the proxy tests, in Python (every template has
// python3; the Incus image has no node): GET /stream answers "first\n", then
// "second\n" 1.5 s later; an Upgrade request gets 101 and an echo of the
// raw bytes; anything else "host=<Host header>".
const SERVER_PY = `
import asyncio, sys
async def handle(r, w):
    try:
        head = (await r.readuntil(b"\\r\\n\\r\\n")).decode("latin-1").split("\\r\\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        w.close(); return
    path = head[0].split()[1]
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in head[1:] if l)}
    if "upgrade" in hdrs:
        w.write(b"HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: compat-echo\\r\\nConnection: Upgrade\\r\\n\\r\\n")
        while data := await r.read(65536):
            w.write(data); await w.drain()
    elif path == "/stream":
        w.write(b"HTTP/1.1 200 OK\\r\\ncontent-type: text/plain\\r\\ntransfer-encoding: chunked\\r\\nconnection: close\\r\\n\\r\\n6\\r\\nfirst\\n\\r\\n")
        await w.drain()
        await asyncio.sleep(1.5)
        w.write(b"7\\r\\nsecond\\n\\r\\n0\\r\\n\\r\\n")
    else:
        body = ("host=" + hdrs.get("host", "")).encode()
        w.write(b"HTTP/1.1 200 OK\\r\\ncontent-length: %d\\r\\nconnection: close\\r\\n\\r\\n" % len(body) + body)
    await w.drain()
    w.close()
async def main():
    srv = await asyncio.start_server(handle, "0.0.0.0", int(sys.argv[1]))
    await srv.serve_forever()
asyncio.run(main())
`

/** Starts SERVER_PY on port inside s; resolves once the proxy reaches it. */
async function startServer(s, port) {
  await s.files.write(`/tmp/compat-server-${port}.py`, SERVER_PY)
  const h = await s.commands.run(`python3 /tmp/compat-server-${port}.py ${port}`, { background: true, timeoutMs: 0 })
  const route = { 'E2b-Sandbox-Id': s.sandboxId, 'E2b-Sandbox-Port': String(port) }
  let st
  await waitFor(async () => (st = (await fetch(`${ENVD_URL}/`, { headers: route })).status) === 200, () => `server on ${port} (last ${st})`, 15_000)
  return { h, route }
}

test('lifecycle: port proxy streams responses and passes HTTP Upgrade (WebSocket-style) through', S, async () => {
  const { h, route } = await startServer(sbx, 8002)
  try {
    // streaming: the first chunk arrives while the upstream still writes
    const t0 = Date.now()
    const res = await fetch(`${ENVD_URL}/stream`, { headers: route })
    assert.equal(res.status, 200)
    const reader = res.body.getReader()
    const first = Buffer.from((await reader.read()).value).toString()
    const firstAt = Date.now() - t0
    assert.equal(first, 'first\n')
    assert.ok(firstAt < 1200, `first chunk after ${firstAt} ms: the proxy buffers the response`)
    let rest = ''
    for (;;) {
      const { value, done } = await reader.read()
      if (done) break
      rest += Buffer.from(value).toString()
    }
    assert.equal(rest, 'second\n')

    // Upgrade: 101, then raw bytes both ways
    const { port, hostname } = new URL(ENVD_URL)
    const sock = rawConnect(ENVD_URL)
    const got = await new Promise((resolve, reject) => {
      let buf = ''
      let upgraded = false
      sock.setTimeout(10_000, () => reject(new Error(`timeout; got ${JSON.stringify(buf)}`)))
      sock.on('error', reject)
      sock.on('data', (d) => {
        buf += d.toString()
        if (!upgraded && buf.includes('\r\n\r\n')) {
          upgraded = true
          const head = buf.slice(0, buf.indexOf('\r\n\r\n'))
          if (!/^HTTP\/1\.1 101/.test(head)) return reject(new Error(`no 101: ${head}`))
          buf = buf.slice(buf.indexOf('\r\n\r\n') + 4)
          sock.write('ping-through-proxy')
        }
        if (upgraded && buf === 'ping-through-proxy') resolve(buf)
      })
      sock.write(
        `GET /ws HTTP/1.1\r\nHost: ${hostname}:${port}\r\nE2b-Sandbox-Id: ${route['E2b-Sandbox-Id']}\r\n` +
          `E2b-Sandbox-Port: ${route['E2b-Sandbox-Port']}\r\nConnection: Upgrade\r\nUpgrade: compat-echo\r\n\r\n`,
      )
    }).finally(() => sock.destroy())
    assert.equal(got, 'ping-through-proxy')
  } finally {
    await h.kill()
  }
})

test('lifecycle: getHost(port) is routable by Host header (`<port>-<id>.<domain>`)', S, async () => {
  // In domain mode `https://<getHost()>` resolves (*.localhost) and is
  // fetched as a browser would. Otherwise there is no wildcard DNS: connect
  // to sandboxd and send getHost() as Host, which is what DNS + a plain
  // client would do (run.sh serves --domain sandboxd.test).
  const { h } = await startServer(sbx, 8003)
  try {
    const host = sbx.getHost(8003)
    assert.equal(host, `8003-${sbx.sandboxId}.${sbx.sandboxDomain}`)
    if (DOMAIN_MODE) {
      const res = await fetch(`https://${host}/`)
      assert.equal(`${res.status} ${await res.text()}`, `200 host=${host}`)
      return
    }
    const { port, hostname } = new URL(ENVD_URL)
    const body = await new Promise((resolve, reject) => {
      const req = http.request({ host: hostname, port, path: '/', headers: { Host: host } }, (res) => {
        let b = ''
        res.on('data', (d) => (b += d))
        res.on('end', () => resolve(`${res.statusCode} ${b}`))
      })
      req.on('error', reject)
      req.end()
    })
    assert.equal(body, `200 host=${host}`)
  } finally {
    await h.kill()
  }
})

test('lifecycle: network.maskRequestHost is the Host a port sees (${PORT} replaced)', S, async () => {
  const s = await create({ network: { maskRequestHost: 'localhost:${PORT}' } })
  try {
    assert.equal((await s.getInfo()).network?.maskRequestHost, 'localhost:${PORT}')
    const { h, route } = await startServer(s, 8004)
    try {
      const res = await fetch(`${ENVD_URL}/`, { headers: route })
      assert.equal(await res.text(), 'host=localhost:8004')
    } finally {
      await h.kill()
    }
  } finally {
    await s.kill()
  }
})

test('lifecycle: allowPublicTraffic false: ports need e2b-traffic-access-token, envd does not', S, async () => {
  const s = await create({ network: { allowPublicTraffic: false } })
  try {
    assert.ok(s.trafficAccessToken, 'trafficAccessToken must be returned')
    const server = await s.commands.run('cd /tmp && python3 -m http.server 8001 --bind 0.0.0.0', { background: true, timeoutMs: 0 })
    const route = { 'E2b-Sandbox-Id': s.sandboxId, 'E2b-Sandbox-Port': '8001' }
    const withToken = { ...route, 'e2b-traffic-access-token': s.trafficAccessToken }
    let st
    await waitFor(async () => (st = (await fetch(`${ENVD_URL}/`, { headers: withToken })).status) === 200, () => `http.server (last ${st})`, 15_000)
    const no = await fetch(`${ENVD_URL}/`, { headers: route })
    assert.equal(no.status, 403)
    assert.equal((await no.json()).code, 403)
    assert.equal((await fetch(`${ENVD_URL}/`, { headers: { ...route, 'e2b-traffic-access-token': 'wrong' } })).status, 403)
    // envd's port is exempt (it has X-Access-Token): the SDK keeps working.
    assert.equal((await s.commands.run('echo ok')).stdout, 'ok\n')
    await server.kill()
  } finally {
    await s.kill()
  }
})

test('lifecycle: proxy routing errors: unknown sandbox 502, half a route 400', S, async () => {
  const r = await fetch(`${ENVD_URL}/health`, { headers: { 'E2b-Sandbox-Id': 'compatnosuchsandbox0', 'E2b-Sandbox-Port': '49983' } })
  assert.equal(r.status, 502)
  const body = await r.json()
  assert.equal(body.message, 'The sandbox was not found')
  const half = await fetch(`${ENVD_URL}/health`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId } })
  assert.equal(half.status, 400)
})

test('lifecycle: secure sandbox: raw envd requests without X-Access-Token are 401', S, async () => {
  const route = envdHeaders(sbx, { token: false })
  const rpc = (headers) =>
    fetch(`${ENVD_URL}/filesystem.Filesystem/Stat`, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1', ...route, ...headers },
      body: JSON.stringify({ path: '/etc/hostname' }),
    })
  const noToken = await rpc({})
  assert.equal(noToken.status, 401, await noToken.clone().text())
  const wrong = await rpc({ 'X-Access-Token': 'wrong-token' })
  assert.equal(wrong.status, 401)
  const ok = await rpc({ 'X-Access-Token': sbx.envdAccessToken })
  assert.equal(ok.status, 200, await ok.clone().text())
  const files = await fetch(`${ENVD_URL}/files?path=/etc/hostname`, { headers: route })
  assert.equal(files.status, 401)
  assert.equal((await files.json()).code, 401)
  const withToken = await fetch(`${ENVD_URL}/files?path=/etc/hostname`, { headers: envdHeaders(sbx) })
  assert.equal(withToken.status, 200)
  // /health stays open
  assert.equal((await fetch(`${ENVD_URL}/health`, { headers: route })).status, 204)
  // envd's POST /init (which sets the token) is not reachable through the proxy
  const init = await fetch(`${ENVD_URL}/init`, {
    method: 'POST',
    headers: { ...route, 'Content-Type': 'application/json' },
    body: JSON.stringify({ accessToken: 'hijacked', timestamp: new Date().toISOString() }),
  })
  assert.ok(init.status >= 400, `POST /init through the proxy -> ${init.status}`)
  assert.equal((await sbx.commands.run('echo still-mine')).stdout, 'still-mine\n')
})

test('lifecycle: CORS preflight for envd through the proxy (browser SDK)', S, async () => {
  const r = await fetch(`${ENVD_URL}/process.Process/Start`, {
    method: 'OPTIONS',
    headers: {
      Origin: 'http://example.test',
      'Access-Control-Request-Method': 'POST',
      'Access-Control-Request-Headers': 'e2b-sandbox-id,e2b-sandbox-port,x-access-token,content-type,connect-protocol-version',
    },
  })
  assert.ok(r.status >= 200 && r.status < 300, `preflight -> ${r.status}`)
  const origin = r.headers.get('access-control-allow-origin')
  assert.ok(origin === '*' || origin === 'http://example.test', `allow-origin ${origin}`)
  const allowed = (r.headers.get('access-control-allow-headers') || '').toLowerCase()
  for (const h of ['e2b-sandbox-id', 'x-access-token', 'content-type']) {
    assert.ok(allowed === '*' || allowed.includes(h), `allow-headers ${allowed} lacks ${h}`)
  }
})

test('lifecycle: signed uploadUrl/downloadUrl with the routing headers', S, async () => {
  const path = `${HOME}/compat-signed-${RUN}.txt`
  const route = envdHeaders(sbx, { token: false })
  const up = await sbx.uploadUrl(path)
  assert.match(up, /[?&]signature=v1_/)
  const form = new FormData()
  form.append('file', new Blob(['signed upload']), 'x.txt')
  const res = await fetch(up, { method: 'POST', body: form, headers: route })
  assert.equal(res.status, 200, await res.clone().text())
  const got = await fetch(await sbx.downloadUrl(path), { headers: route })
  assert.equal(got.status, 200)
  assert.equal(await got.text(), 'signed upload')
  // an unsigned URL is refused
  const unsigned = await fetch(`${ENVD_URL}/files?path=${encodeURIComponent(path)}`, { headers: route })
  assert.equal(unsigned.status, 401)
  await sbx.files.remove(path)
})

test('lifecycle: signed uploadUrl/downloadUrl work as given (no headers)', S, async () => {
  // What a user does with the URLs: hand them to a plain HTTP client. With
  // E2B_SANDBOX_URL the SDK builds them on that origin and they carry no
  // sandbox id, so the proxy routes them by the signature alone; with
  // E2B_DOMAIN they are on the sandbox's own host.
  const path = `${HOME}/compat-plain-${RUN}.txt`
  const up = await sbx.uploadUrl(path)
  const origin = DOMAIN_MODE ? `https://${sbx.getHost(49983)}` : ENVD_URL
  assert.ok(up.startsWith(`${origin}/files?`), up)
  const form = new FormData()
  form.append('file', new Blob(['plain upload']), 'x.txt')
  const res = await fetch(up, { method: 'POST', body: form })
  assert.equal(res.status, 200, `POST ${up} -> ${res.status} ${await res.clone().text()}`)
  const down = await sbx.downloadUrl(path)
  const got = await fetch(down)
  assert.equal(got.status, 200, `GET ${down} -> ${got.status} ${await got.clone().text()}`)
  assert.equal(await got.text(), 'plain upload')
})

test('lifecycle: 20 concurrent sandboxes each run a command', { ...S, timeout: 90_000 }, async () => {
  const tag = randomBytes(3).toString('hex')
  const results = await Promise.allSettled(
    Array.from({ length: 20 }, (_, i) => create({ metadata: { burst: tag, i: String(i) }, timeoutMs: 120_000 })),
  )
  const sbxs = results.filter((r) => r.status === 'fulfilled').map((r) => r.value)
  try {
    const failed = results.filter((r) => r.status === 'rejected').map((r) => `${r.reason?.constructor?.name}: ${r.reason?.message}`)
    assert.deepEqual(failed, [], 'creates failed')
    assert.equal(new Set(sbxs.map((s) => s.sandboxId)).size, 20)
    const outs = await Promise.all(sbxs.map((s, i) => s.commands.run(`echo sandbox-${i} $(hostname)`)))
    outs.forEach((r, i) => assert.match(r.stdout, new RegExp(`^sandbox-${i} `)))
    assert.equal((await listAll({ query: { metadata: { burst: tag } } })).length, 20)
  } finally {
    await Promise.all(sbxs.map((s) => s.kill().catch(() => {})))
  }
  assert.equal((await listAll({ query: { metadata: { burst: tag } } })).length, 0)
})

test('lifecycle: a bad API key raises AuthenticationError', S, async () => {
  const apiKey = 'e2b_' + '0'.repeat(40)
  await assert.rejects(Sandbox.create({ apiKey }), AuthenticationError)
  await assert.rejects(Sandbox.list({ apiKey }).nextItems(), AuthenticationError)
  await assert.rejects(Sandbox.connect(sbx.sandboxId, { apiKey }), AuthenticationError)
})

test('lifecycle: an unknown template is an error', S, async () => {
  await assert.rejects(Sandbox.create('compat-no-such-template', { timeoutMs: 10_000 }), (e) => {
    assert.ok(e instanceof SandboxError || e instanceof NotFoundError, `got ${e?.constructor?.name}: ${e?.message}`)
    assert.match(e.message, /template|not found/i)
    return true
  })
})
