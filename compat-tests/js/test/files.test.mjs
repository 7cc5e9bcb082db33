// files.* through the real e2b JS SDK: GET/POST /files plus the
// filesystem.Filesystem RPCs (Stat, ListDir, MakeDir, Move, Remove).
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { FileType, FileNotFoundError, NotFoundError, InvalidArgumentError } from 'e2b'
import { newSandbox, scratch, cleanup, envdHeaders, HOME, T } from './helpers.mjs'

let sbx
let dir // every test works below this absolute scratch directory
before(async () => {
  sbx = await newSandbox()
  dir = scratch('files')
})
after(async () => {
  if (sbx) await cleanup(sbx, dir)
})

const allBytes = () => {
  const b = new Uint8Array(256 * 4)
  for (let i = 0; i < b.length; i++) b[i] = i % 256
  return b
}

test('write/read: text round-trip, WriteInfo fields', T, async () => {
  const path = `${dir}/hello.txt`
  const info = await sbx.files.write(path, 'Hello, world! ✓\n')
  assert.equal(info.name, 'hello.txt')
  assert.equal(info.path, path)
  assert.equal(info.type, FileType.FILE)
  assert.equal(await sbx.files.read(path), 'Hello, world! ✓\n')
  // The file is really there and owned by the default user.
  const r = await sbx.commands.run(`cat ${path}; stat -c '%U:%G %a' ${path}`)
  assert.equal(r.stdout, 'Hello, world! ✓\nuser:user 644\n')
})

test('write: overwrites an existing file (truncates)', T, async () => {
  const path = `${dir}/overwrite.txt`
  await sbx.files.write(path, 'a much longer first content')
  await sbx.files.write(path, 'short')
  assert.equal(await sbx.files.read(path), 'short')
})

test('write: creates missing parent directories', T, async () => {
  const path = `${dir}/deep/er/than/before.txt`
  await sbx.files.write(path, 'x')
  assert.equal(await sbx.files.read(path), 'x')
  assert.equal((await sbx.files.getInfo(`${dir}/deep/er`)).type, FileType.DIR)
})

test('write/read: relative paths resolve against the user home', T, async () => {
  const name = scratch('rel').slice(HOME.length + 1)
  try {
    const info = await sbx.files.write(name, 'relative')
    assert.equal(info.path, `${HOME}/${name}`)
    assert.equal(await sbx.files.read(`${HOME}/${name}`), 'relative')
    assert.equal(await sbx.files.read(`~/${name}`), 'relative')
  } finally {
    await cleanup(sbx, `${HOME}/${name}`)
  }
})

test('write/read: all 256 byte values survive (ArrayBuffer in, bytes/blob out)', T, async () => {
  const path = `${dir}/bytes.bin`
  const data = allBytes()
  await sbx.files.write(path, data.buffer)
  const back = await sbx.files.read(path, { format: 'bytes' })
  assert.ok(back instanceof Uint8Array)
  assert.deepEqual(Buffer.from(back), Buffer.from(data))
  const blob = await sbx.files.read(path, { format: 'blob' })
  assert.deepEqual(Buffer.from(await blob.arrayBuffer()), Buffer.from(data))
  const sum = await sbx.commands.run(`sha256sum ${path} | cut -d' ' -f1`)
  const { createHash } = await import('node:crypto')
  assert.equal(sum.stdout.trim(), createHash('sha256').update(data).digest('hex'))
})

test('write/read: octet-stream and gzip upload paths, stream read', T, async () => {
  const data = allBytes()
  await sbx.files.write(`${dir}/octet.bin`, new Blob([data]), { useOctetStream: true })
  assert.deepEqual(Buffer.from(await sbx.files.read(`${dir}/octet.bin`, { format: 'bytes' })), Buffer.from(data))
  await sbx.files.write(`${dir}/gzip.bin`, data.buffer, { gzip: true })
  assert.deepEqual(
    Buffer.from(await sbx.files.read(`${dir}/gzip.bin`, { format: 'bytes', gzip: true })),
    Buffer.from(data),
  )
  const big = 'Streamed read content. '.repeat(10_000)
  await sbx.files.write(`${dir}/stream.txt`, big)
  const stream = await sbx.files.read(`${dir}/stream.txt`, { format: 'stream' })
  const chunks = []
  for await (const c of stream) chunks.push(c)
  assert.equal(Buffer.concat(chunks).toString('utf8'), big)
})

test('write/read: 8 MiB of random bytes round-trip', { timeout: 60_000 }, async () => {
  const { randomBytes, createHash } = await import('node:crypto')
  const data = randomBytes(8 * 1024 * 1024)
  const path = `${dir}/big.bin`
  await sbx.files.write(path, data.buffer.slice(data.byteOffset, data.byteOffset + data.length))
  const back = await sbx.files.read(path, { format: 'bytes' })
  assert.equal(back.length, data.length)
  assert.ok(Buffer.from(back).equals(data), 'content differs')
  const sum = await sbx.commands.run(`sha256sum ${path} | cut -d' ' -f1`)
  assert.equal(sum.stdout.trim(), createHash('sha256').update(data).digest('hex'))
})

test('write: metadata is stored and read back (lower-cased keys)', T, async () => {
  const path = `${dir}/meta.txt`
  const info = await sbx.files.write(path, 'm', { metadata: { Owner: 'compat', kind: 'test-file' } })
  assert.deepEqual(info.metadata, { owner: 'compat', kind: 'test-file' })
  assert.deepEqual((await sbx.files.getInfo(path)).metadata, { owner: 'compat', kind: 'test-file' })
  // An upload without metadata clears it.
  await sbx.files.write(path, 'm2')
  const after = (await sbx.files.getInfo(path)).metadata
  assert.ok(after === undefined || Object.keys(after).length === 0, JSON.stringify(after))
})

test('read: empty file in text and bytes formats', T, async () => {
  const path = `${dir}/empty.txt`
  await sbx.commands.run(`mkdir -p ${dir} && : > ${path}`)
  assert.equal(await sbx.files.read(path), '')
  assert.equal((await sbx.files.read(path, { format: 'bytes' })).length, 0)
})

test('write/read/list: unicode, spaces and URL-special characters in names', T, async () => {
  const names = ['žluťoučký kůň 🐎.txt', 'a b&c=d?e#f%20.txt', "quote'd \"x\".txt"]
  for (const n of names) {
    const info = await sbx.files.write(`${dir}/odd/${n}`, `content of ${n}`)
    assert.equal(info.name, n)
    assert.equal(info.path, `${dir}/odd/${n}`)
    assert.equal(await sbx.files.read(`${dir}/odd/${n}`), `content of ${n}`)
    assert.equal((await sbx.files.getInfo(`${dir}/odd/${n}`)).name, n)
  }
  assert.deepEqual((await sbx.files.list(`${dir}/odd`)).map((e) => e.name).sort(), [...names].sort())
  const r = await sbx.commands.run(`cat "${dir}/odd/žluťoučký kůň 🐎.txt"`)
  assert.equal(r.stdout, 'content of žluťoučký kůň 🐎.txt')
})

test('writeFiles: 50 files in one multipart request', T, async () => {
  const files = Array.from({ length: 50 }, (_, i) => ({ path: `${dir}/many/f${String(i).padStart(2, '0')}.txt`, data: `n${i}` }))
  const infos = await sbx.files.write(files)
  assert.equal(infos.length, 50)
  const entries = await sbx.files.list(`${dir}/many`)
  assert.deepEqual(entries.map((e) => e.name), files.map((f) => f.path.split('/').pop()))
  assert.equal(await sbx.files.read(`${dir}/many/f42.txt`), 'n42')
})

test('writeFiles: several files in one request', T, async () => {
  const files = [
    { path: `${dir}/multi/a.txt`, data: 'file a' },
    { path: `${dir}/multi/sub/b.txt`, data: 'file b' },
    { path: `${dir}/multi/c.bin`, data: allBytes().buffer },
  ]
  const infos = await sbx.files.write(files)
  assert.equal(infos.length, 3)
  assert.deepEqual(infos.map((i) => i.path).sort(), files.map((f) => f.path).sort())
  for (const i of infos) assert.equal(i.name, i.path.split('/').pop())
  assert.equal(await sbx.files.read(files[0].path), 'file a')
  assert.equal(await sbx.files.read(files[1].path), 'file b')
  assert.deepEqual(Buffer.from(await sbx.files.read(files[2].path, { format: 'bytes' })), Buffer.from(allBytes()))
  const infos2 = await sbx.files.writeFiles([{ path: `${dir}/multi/d.txt`, data: 'file d' }])
  assert.equal(infos2.length, 1)
  assert.equal(await sbx.files.read(`${dir}/multi/d.txt`), 'file d')
})

test('list: depth 1 (default), 2 and 3 with names, types, paths in order', T, async () => {
  const p = `${dir}/tree`
  for (const d of ['subdir1/subdir1_1', 'subdir1/subdir1_2', 'subdir2/subdir2_1', 'subdir2/subdir2_2']) {
    await sbx.files.makeDir(`${p}/${d}`)
  }
  await sbx.files.write(`${p}/file1.txt`, 'Hello, world!')
  const shallow = ['file1.txt', 'subdir1', 'subdir2']
  const deep = ['file1.txt', 'subdir1', 'subdir1/subdir1_1', 'subdir1/subdir1_2', 'subdir2', 'subdir2/subdir2_1', 'subdir2/subdir2_2']
  for (const [opts, want] of [[undefined, shallow], [{ depth: 1 }, shallow], [{ depth: 2 }, deep], [{ depth: 3 }, deep]]) {
    const entries = await sbx.files.list(p, opts)
    assert.deepEqual(entries.map((e) => e.path), want.map((w) => `${p}/${w}`), `depth ${opts?.depth}`)
    assert.deepEqual(entries.map((e) => e.name), want.map((w) => w.split('/').pop()))
    assert.deepEqual(entries.map((e) => e.type), want.map((w) => (w.endsWith('.txt') ? FileType.FILE : FileType.DIR)))
  }
})

test('list: entry details (size, mode, permissions, owner, modifiedTime, symlink)', T, async () => {
  const p = `${dir}/details`
  await sbx.files.write(`${p}/test.txt`, 'Hello, World!')
  await sbx.files.makeDir(`${p}/subdir`)
  await sbx.commands.run(`ln -s test.txt ${p}/link.txt`)
  const entries = await sbx.files.list(p)
  const byName = Object.fromEntries(entries.map((e) => [e.name, e]))
  assert.deepEqual(Object.keys(byName).sort(), ['link.txt', 'subdir', 'test.txt'])
  const f = byName['test.txt']
  assert.equal(f.type, FileType.FILE)
  assert.equal(f.size, 13)
  assert.equal(f.mode, 0o644)
  assert.equal(f.permissions, '-rw-r--r--')
  assert.equal(f.owner, 'user')
  assert.equal(f.group, 'user')
  assert.ok(f.modifiedTime instanceof Date)
  assert.ok(Math.abs(f.modifiedTime.getTime() - Date.now()) < 120_000, `modifiedTime ${f.modifiedTime}`)
  assert.equal(f.symlinkTarget, undefined)
  const d = byName.subdir
  assert.equal(d.type, FileType.DIR)
  assert.equal(d.mode, 0o755)
  assert.equal(d.permissions, 'drwxr-xr-x')
  // Like upstream envd: a symlink reports its target's type and the
  // resolved absolute target.
  const l = byName['link.txt']
  assert.equal(l.type, FileType.FILE)
  assert.equal(l.symlinkTarget, `${p}/test.txt`)
})

test('getInfo: file, directory and symlink fields', T, async () => {
  const p = `${dir}/info`
  await sbx.files.write(`${p}/test_file.txt`, 'test')
  const fi = await sbx.files.getInfo(`${p}/test_file.txt`)
  assert.equal(fi.name, 'test_file.txt')
  assert.equal(fi.type, FileType.FILE)
  assert.equal(fi.path, `${p}/test_file.txt`)
  assert.equal(fi.size, 4)
  assert.equal(fi.mode, 0o644)
  assert.equal(fi.permissions, '-rw-r--r--')
  assert.equal(fi.owner, 'user')
  assert.equal(fi.group, 'user')
  assert.ok(fi.modifiedTime instanceof Date && !isNaN(fi.modifiedTime))
  const di = await sbx.files.getInfo(p)
  assert.equal(di.name, 'info')
  assert.equal(di.type, FileType.DIR)
  assert.equal(di.path, p)
  assert.ok(di.size > 0)
  assert.equal(di.mode, 0o755)
  assert.equal(di.permissions, 'drwxr-xr-x')
  await sbx.commands.run(`ln -s test_file.txt ${p}/link.txt`)
  const li = await sbx.files.getInfo(`${p}/link.txt`)
  assert.equal(li.name, 'link.txt')
  assert.equal(li.type, FileType.FILE)
  assert.equal(li.symlinkTarget, `${p}/test_file.txt`)
  const root = await sbx.files.getInfo('/etc/hostname', { user: 'root' })
  assert.equal(root.owner, 'root')
})

test('exists: files and directories, true and false', T, async () => {
  await sbx.files.write(`${dir}/exists.txt`, 'x')
  assert.equal(await sbx.files.exists(`${dir}/exists.txt`), true)
  assert.equal(await sbx.files.exists(dir), true)
  assert.equal(await sbx.files.exists(`${dir}/nope.txt`), false)
  assert.equal(await sbx.files.exists(`${dir}/nope/deeper`), false)
})

test('rename: moves a file and returns the new EntryInfo', T, async () => {
  await sbx.files.write(`${dir}/old.txt`, 'moving')
  const info = await sbx.files.rename(`${dir}/old.txt`, `${dir}/new.txt`)
  assert.equal(info.name, 'new.txt')
  assert.equal(info.path, `${dir}/new.txt`)
  assert.equal(info.type, FileType.FILE)
  assert.equal(await sbx.files.exists(`${dir}/old.txt`), false)
  assert.equal(await sbx.files.read(`${dir}/new.txt`), 'moving')
})

test('rename: directories, and a missing source raises FileNotFoundError', T, async () => {
  await sbx.files.write(`${dir}/mvdir/inner.txt`, 'in')
  const info = await sbx.files.rename(`${dir}/mvdir`, `${dir}/mvdir2`)
  assert.equal(info.type, FileType.DIR)
  assert.equal(await sbx.files.read(`${dir}/mvdir2/inner.txt`), 'in')
  await assert.rejects(sbx.files.rename(`${dir}/missing`, `${dir}/x`), FileNotFoundError)
})

test('remove: file, non-empty directory, and missing path is not an error', T, async () => {
  await sbx.files.write(`${dir}/rm.txt`, 'bye')
  await sbx.files.remove(`${dir}/rm.txt`)
  assert.equal(await sbx.files.exists(`${dir}/rm.txt`), false)
  await sbx.files.write(`${dir}/rmdir/a/b.txt`, 'bye')
  await sbx.files.remove(`${dir}/rmdir`)
  assert.equal(await sbx.files.exists(`${dir}/rmdir`), false)
  await sbx.files.remove(`${dir}/never-existed.txt`)
})

test('makeDir: true when created (with parents), false when it exists', T, async () => {
  assert.equal(await sbx.files.makeDir(`${dir}/mk/nested/deeper`), true)
  const info = await sbx.files.getInfo(`${dir}/mk/nested/deeper`)
  assert.equal(info.type, FileType.DIR)
  assert.equal(info.owner, 'user')
  assert.equal(await sbx.files.makeDir(`${dir}/mk/nested/deeper`), false)
  assert.equal(await sbx.files.makeDir(`${dir}/mk`), false)
})

test('user option: root writes root-owned files; relative paths use /root', T, async () => {
  const path = `${dir}/rootfile.txt`
  await sbx.files.makeDir(dir)
  await sbx.files.write(path, 'root was here', { user: 'root' })
  assert.equal((await sbx.files.getInfo(path)).owner, 'root')
  assert.equal(await sbx.files.read(path, { user: 'user' }), 'root was here')
  const rel = await sbx.files.write('compat-js-root-rel.txt', 'r', { user: 'root' })
  assert.equal(rel.path, '/root/compat-js-root-rel.txt')
  await cleanup(sbx, '/root/compat-js-root-rel.txt')
})

test('read: missing file raises FileNotFoundError (also a NotFoundError)', T, async () => {
  await assert.rejects(sbx.files.read(`${dir}/does-not-exist.txt`), (e) => {
    assert.ok(e instanceof FileNotFoundError, `expected FileNotFoundError, got ${e?.constructor?.name}: ${e?.message}`)
    assert.ok(e instanceof NotFoundError)
    return true
  })
  await assert.rejects(sbx.files.read(`${dir}/does-not-exist.txt`, { format: 'bytes' }), FileNotFoundError)
})

test('getInfo/list of a missing path raise FileNotFoundError', T, async () => {
  await assert.rejects(sbx.files.getInfo(`${dir}/missing-info`), FileNotFoundError)
  await assert.rejects(sbx.files.list(`${dir}/missing-dir`), FileNotFoundError)
})

test('write onto a directory and makeDir onto a file raise InvalidArgumentError', T, async () => {
  await sbx.files.write(`${dir}/isfile.txt`, 'x')
  await sbx.files.makeDir(`${dir}/isdir`)
  await assert.rejects(sbx.files.write(`${dir}/isdir`, 'x'), (e) => {
    assert.ok(e instanceof InvalidArgumentError, `expected InvalidArgumentError, got ${e?.constructor?.name}: ${e?.message}`)
    return true
  })
  await assert.rejects(sbx.files.makeDir(`${dir}/isfile.txt`), (e) => {
    assert.ok(e instanceof InvalidArgumentError, `expected InvalidArgumentError, got ${e?.constructor?.name}: ${e?.message}`)
    return true
  })
  assert.equal(await sbx.files.read(`${dir}/isfile.txt`), 'x')
})

test('read of a directory and list of a file raise InvalidArgumentError', T, async () => {
  await sbx.files.write(`${dir}/plain.txt`, 'x')
  await assert.rejects(sbx.files.read(dir), (e) => {
    assert.ok(e instanceof InvalidArgumentError, `expected InvalidArgumentError, got ${e?.constructor?.name}: ${e?.message}`)
    return true
  })
  await assert.rejects(sbx.files.list(`${dir}/plain.txt`), (e) => {
    assert.ok(e instanceof InvalidArgumentError, `expected InvalidArgumentError, got ${e?.constructor?.name}: ${e?.message}`)
    return true
  })
})

test('uploadUrl/downloadUrl work with a plain HTTP client', T, async () => {
  const path = `${dir}/via-url.bin`
  const data = allBytes()
  // sandboxd mode: the signed URL carries no sandbox id, so the plain client
  // adds the routing headers (no access token). That the URL alone does not
  // route through E2B_SANDBOX_URL is tested in lifecycle.test.mjs.
  const headers = envdHeaders(sbx, { token: false })
  const up = await sbx.uploadUrl(path)
  const u = new URL(up)
  assert.equal(u.pathname, '/files')
  assert.equal(u.searchParams.get('path'), path)
  const form = new FormData()
  form.append('file', new Blob([data]), 'via-url.bin')
  const res = await fetch(up, { method: 'POST', body: form, headers })
  assert.equal(res.status, 200, await res.clone().text())
  const body = await res.json()
  assert.ok(Array.isArray(body) && body.length === 1, JSON.stringify(body))
  assert.equal(body[0].path, path)
  assert.equal(body[0].name, 'via-url.bin')
  assert.equal(body[0].type, 'file')

  const down = await sbx.downloadUrl(path)
  const got = await fetch(down, { headers })
  assert.equal(got.status, 200)
  assert.deepEqual(Buffer.from(await got.arrayBuffer()), Buffer.from(data))

  const part = await fetch(down, { headers: { ...headers, Range: 'bytes=10-19' } })
  assert.equal(part.status, 206)
  assert.deepEqual(Buffer.from(await part.arrayBuffer()), Buffer.from(data.subarray(10, 20)))

  const asRoot = await fetch(await sbx.downloadUrl(path, { user: 'root' }), { headers })
  assert.equal(asRoot.status, 200)
  await asRoot.arrayBuffer()
  const missing = await fetch(await sbx.downloadUrl(`${dir}/nope.bin`), { headers })
  assert.equal(missing.status, 404)
  const err = await missing.json()
  assert.equal(err.code, 404)
  assert.equal(typeof err.message, 'string')
})
