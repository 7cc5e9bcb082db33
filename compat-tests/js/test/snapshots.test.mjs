// Snapshots and forks through the real e2b JS SDK against a real sandboxd:
// createSnapshot / Sandbox.create(snapshotId) / listSnapshots /
// deleteSnapshot, and sandbox.fork(). sandboxd keeps a sandbox's files (not
// its processes). sandboxd mode only (COMPAT_TARGET=sandboxd).
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { Sandbox } from 'e2b'
import { SANDBOXD_ONLY } from './helpers.mjs'

const S = { ...SANDBOXD_ONLY, timeout: 120_000 }
const RUN = randomBytes(4).toString('hex')
const made = new Set()
const snapshots = new Set()

after(async () => {
  for (const id of made) await Sandbox.kill(id).catch(() => {})
  for (const id of snapshots) await Sandbox.deleteSnapshot(id).catch(() => {})
})

async function create(template, opts = {}) {
  const o = { timeoutMs: 300_000, ...opts, metadata: { compatRun: RUN, ...opts.metadata } }
  const sbx = template ? await Sandbox.create(template, o) : await Sandbox.create(o)
  made.add(sbx.sandboxId)
  return sbx
}

async function listSnapshots(opts) {
  const p = Sandbox.listSnapshots(opts)
  const out = []
  while (p.hasNext) out.push(...(await p.nextItems()))
  return out
}

test('snapshots: createSnapshot keeps files and envs; Sandbox.create(snapshotId) starts from them; list; delete', S, async () => {
  const sbx = await create(undefined, { envs: { SNAP_ENV: 'kept' } })
  await sbx.files.write('/home/user/state.txt', 'v1')
  await sbx.commands.run('mkdir -p ~/dir && echo deep > ~/dir/f && rm -f ~/.bashrc')
  const snap = await sbx.createSnapshot()
  snapshots.add(snap.snapshotId)
  assert.match(snap.snapshotId, /:default$/)
  assert.deepEqual(snap.names, [])

  await sbx.files.write('/home/user/state.txt', 'v2')
  const name = `compat-snap-${RUN}`
  const named = await sbx.createSnapshot({ name })
  snapshots.add(named.snapshotId)
  assert.equal(named.snapshotId, `${name}:default`)
  assert.deepEqual(named.names, [name])
  assert.equal(await sbx.files.read('/home/user/state.txt'), 'v2', 'the source runs on')

  const listed = await listSnapshots({ sandboxId: sbx.sandboxId })
  assert.deepEqual(listed.map((s) => s.snapshotId), [named.snapshotId, snap.snapshotId], 'newest first')
  assert.deepEqual((await listSnapshots({ name })).map((s) => s.snapshotId), [named.snapshotId])

  const a = await create(snap.snapshotId)
  assert.equal(await a.files.read('/home/user/state.txt'), 'v1')
  const r = await a.commands.run('cat ~/dir/f; test -e ~/.bashrc && echo bashrc || echo no-bashrc; echo $SNAP_ENV; stat -c %U ~/state.txt')
  assert.equal(r.stdout, 'deep\nno-bashrc\nkept\nuser\n')
  const b = await create(name)
  assert.equal(await b.files.read('/home/user/state.txt'), 'v2')

  assert.equal(await Sandbox.deleteSnapshot(named.snapshotId), true)
  snapshots.delete(named.snapshotId)
  assert.equal(await Sandbox.deleteSnapshot(named.snapshotId), false, 'a deleted snapshot is not found')
  await assert.rejects(create(name), 'no sandbox from a deleted snapshot')
  assert.ok(await b.isRunning(), 'a sandbox of a deleted snapshot runs on')
})

test('fork: each fork has the files, envs and metadata, its own id and timeout; they diverge', S, async () => {
  const sbx = await create(undefined, { metadata: { role: 'forked' }, envs: { FORK_ENV: 'yes' } })
  await sbx.files.write('/home/user/f.txt', 'before')
  const forks = await sbx.fork({ count: 2, timeoutMs: 120_000 })
  assert.equal(forks.length, 2)
  const ids = new Set([sbx.sandboxId])
  for (const f of forks) {
    assert.ok(f instanceof Sandbox, `a fork failed: ${f}`)
    made.add(f.sandboxId)
    ids.add(f.sandboxId)
    assert.equal(await f.files.read('/home/user/f.txt'), 'before')
    assert.equal((await f.commands.run('echo $FORK_ENV')).stdout, 'yes\n')
    const info = await f.getInfo()
    assert.equal(info.metadata.role, 'forked')
    const left = info.endAt.getTime() - Date.now()
    assert.ok(left > 60_000 && left <= 125_000, `fork ends in ${left} ms, want its own 120 s`)
    await f.files.write('/home/user/f.txt', `fork ${f.sandboxId}`)
  }
  assert.equal(ids.size, 3, 'every fork has an id of its own')
  assert.equal(await sbx.files.read('/home/user/f.txt'), 'before', 'the forks wrote apart from the source')
  assert.equal(await forks[0].files.read('/home/user/f.txt'), `fork ${forks[0].sandboxId}`)
})

test('fork and snapshot: an unknown sandbox is not found; a paused one is refused', S, async () => {
  await assert.rejects(Sandbox.fork('compatnosuchsandbox0'), (e) => e.name === 'SandboxNotFoundError' || e.name === 'NotFoundError')
  await assert.rejects(Sandbox.createSnapshot('compatnosuchsandbox0'), (e) => e.name === 'SandboxNotFoundError' || e.name === 'NotFoundError')
  const sbx = await create()
  await sbx.pause()
  await assert.rejects(sbx.fork(), /paused/)
  await assert.rejects(sbx.createSnapshot(), /paused/)
})
