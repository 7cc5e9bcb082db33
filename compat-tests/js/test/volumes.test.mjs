// E2B volumes through the real e2b JS SDK: the control API (/volumes), the
// content API (/volumecontent with the volume's token, at
// E2B_VOLUME_API_URL) and volumeMounts on create.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Volume, VolumeError, VolumeNotFoundError, VolumePathNotFoundError } from 'e2b'
import { newSandbox, NO_VOLUMES, SANDBOXD_ONLY } from './helpers.mjs'

const T = { ...SANDBOXD_ONLY, timeout: 120_000, ...(NO_VOLUMES && { skip: NO_VOLUMES }) }
const name = (p) => `${p}-js-${Date.now().toString(36)}-${Math.floor(Math.random() * 1e6)}`

test('volume: create, content API, mounted in two sandboxes, delete', T, async (t) => {
  const vol = await Volume.create(name('data'))
  t.after(() => Volume.destroy(vol.volumeId).catch(() => {}))
  assert.ok(vol.volumeId)
  assert.ok(vol.token)

  const info = await Volume.getInfo(vol.volumeId)
  assert.equal(info.name, vol.name)
  assert.ok((await Volume.list()).some((v) => v.volumeId === vol.volumeId))

  const st = await vol.writeFile('/hello.txt', 'from the api\n')
  assert.equal(st.name, 'hello.txt')
  assert.equal(st.type, 'file')
  assert.equal(st.size, 13)
  await vol.makeDir('/sub/deep', { force: true })
  assert.equal(await vol.readFile('/hello.txt'), 'from the api\n')
  assert.ok(await vol.exists('/sub/deep'))
  assert.equal(await vol.exists('/nope'), false)
  await assert.rejects(vol.readFile('/nope'), VolumePathNotFoundError)

  const a = await newSandbox({ volumeMounts: { '/mnt/data': vol } })
  const b = await newSandbox({ volumeMounts: { '/mnt/data': vol.name } })
  assert.deepEqual((await a.getInfo()).volumeMounts, [{ name: vol.name, path: '/mnt/data' }])
  const r = await a.commands.run('cat /mnt/data/hello.txt && id -u')
  assert.equal(r.stdout, 'from the api\n1000\n')
  await a.commands.run('echo from a > /mnt/data/a.txt')
  assert.equal((await b.commands.run('cat /mnt/data/a.txt')).stdout, 'from a\n')
  assert.equal(await vol.readFile('/a.txt'), 'from a\n')
  const aStat = await vol.getInfo('/a.txt')
  assert.equal(aStat.uid, 1000)

  // Mounted: deleting is refused until the sandboxes are gone.
  await assert.rejects(Volume.destroy(vol.volumeId), VolumeError)
  await a.kill()
  await b.kill()

  await vol.remove('/sub')
  assert.equal(await vol.exists('/sub'), false)
  assert.equal(await Volume.destroy(vol.volumeId), true)
  await assert.rejects(Volume.getInfo(vol.volumeId), VolumeNotFoundError)
})

test('volume: mount over a system path is refused with 400', T, async (t) => {
  const vol = await Volume.create(name('sys'))
  t.after(() => Volume.destroy(vol.volumeId).catch(() => {}))
  await assert.rejects(newSandbox({ volumeMounts: { '/etc': vol } }), /system path/)
  await assert.rejects(newSandbox({ volumeMounts: { '/mnt/x': 'no-such-volume' } }), /not found/)
})

test('volume: another tenant sees 404', T, async (t) => {
  const other = process.env.COMPAT_OTHER_API_KEY
  if (!other) return t.skip('no second API key (COMPAT_OTHER_API_KEY)')
  const vol = await Volume.create(name('mine'))
  t.after(() => Volume.destroy(vol.volumeId).catch(() => {}))
  await assert.rejects(Volume.getInfo(vol.volumeId, { apiKey: other }), VolumeNotFoundError)
  assert.equal(await Volume.destroy(vol.volumeId, { apiKey: other }), false)
  assert.ok(!(await Volume.list({ apiKey: other })).some((v) => v.volumeId === vol.volumeId))
})
