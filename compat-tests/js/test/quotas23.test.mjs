// Issue 23's quotas and tenant boundaries through the real e2b JS SDK: a
// tenant's volume quota (count and total size: run.sh makes tenants with
// small ones) and another tenant deleting a snapshot. sandboxd mode only.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { Sandbox, Volume, VolumeError } from 'e2b'
import { NO_VOLUMES, SANDBOXD_ONLY } from './helpers.mjs'

const S = { ...SANDBOXD_ONLY, timeout: 120_000 }
const RUN = randomBytes(4).toString('hex')

for (const [what, env, want] of [
  ['two volumes', 'COMPAT_QUOTA_API_KEY', /volume quota exceeded: the tenant has 2 of 2 volumes/],
  ['40 MiB of volumes', 'COMPAT_QUOTA_MB_API_KEY', /volume quota exceeded: .*above its limit of 40 MiB/],
]) {
  test(`volume quota of ${what}: up to it works, one more is refused and makes nothing, a delete frees a share`, { ...S, ...(NO_VOLUMES && { skip: NO_VOLUMES }) }, async (t) => {
    const apiKey = process.env[env]
    if (!apiKey) return t.skip(`no key of a tenant with a volume quota (${env})`)
    const made = new Map()
    t.after(async () => {
      for (const id of made.keys()) await Volume.destroy(id, { apiKey }).catch(() => {})
    })
    const create = async (name) => {
      const v = await Volume.create(`${name}-${RUN}`, { apiKey })
      made.set(v.volumeId, v)
      return v
    }
    const names = async () => (await Volume.list({ apiKey })).map((v) => v.name).sort()
    const first = await create('q0')
    await create('q1')
    await assert.rejects(Volume.create(`over-${RUN}`, { apiKey }), (e) => e instanceof VolumeError && want.test(e.message))
    assert.deepEqual(await names(), [`q0-${RUN}`, `q1-${RUN}`], 'the refused volume is not listed')

    assert.equal(await Volume.destroy(first.volumeId, { apiKey }), true)
    made.delete(first.volumeId)
    const over = await create('over') // its name was never taken
    await over.writeFile('/f', 'fits')
    assert.equal(await over.readFile('/f'), 'fits')
    assert.deepEqual(await names(), [`over-${RUN}`, `q1-${RUN}`])
  })
}

test('snapshot: another tenant cannot delete it (false, as for a missing one), and it stays usable', S, async (t) => {
  const other = process.env.COMPAT_OTHER_API_KEY
  if (!other) return t.skip('no second API key (COMPAT_OTHER_API_KEY)')
  const sbx = await Sandbox.create({ timeoutMs: 300_000, metadata: { compatRun: RUN } })
  t.after(() => sbx.kill().catch(() => {}))
  await sbx.files.write('/home/user/kept.txt', 'kept')
  const snap = await sbx.createSnapshot()
  t.after(() => Sandbox.deleteSnapshot(snap.snapshotId).catch(() => {}))

  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId, { apiKey: other }), false)
  assert.equal(await Sandbox.deleteSnapshot(`compatnosuchsnap${RUN}:default`, { apiKey: other }), false)
  const listed = []
  for (const p = Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }); p.hasNext; ) listed.push(...(await p.nextItems()))
  assert.deepEqual(listed.map((s) => s.snapshotId), [snap.snapshotId], "the owner still lists it")

  const from = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000, metadata: { compatRun: RUN } })
  t.after(() => from.kill().catch(() => {}))
  assert.equal(await from.files.read('/home/user/kept.txt'), 'kept')
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true, 'its owner can')
})
