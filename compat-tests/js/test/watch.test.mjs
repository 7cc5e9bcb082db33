// files.watchDir through the real e2b JS SDK: the server-streaming
// filesystem.Filesystem/WatchDir RPC.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { FilesystemEventType, FileType, FileNotFoundError, InvalidArgumentError } from 'e2b'
import { newSandbox, scratch, cleanup, waitFor, sleep, T } from './helpers.mjs'

let sbx
let dir
before(async () => {
  sbx = await newSandbox()
  dir = scratch('watch')
})
after(async () => {
  if (sbx) await cleanup(sbx, dir)
})

/** Starts a watch that records every event; returns { events, handle, has }. */
async function record(path, opts) {
  const events = []
  const handle = await sbx.files.watchDir(path, (e) => { events.push(e) }, opts)
  const has = (type, name) => events.some((e) => e.type === type && e.name === name)
  const dump = () => JSON.stringify(events.map((e) => `${e.type}:${e.name}`))
  return { events, handle, has, dump }
}

test('watchDir: overwriting a file with files.write emits WRITE for that name', T, async () => {
  // What E2B's own watch tests rely on: upstream envd truncates and rewrites
  // the file in place, so the watcher sees WRITE <name>.
  const d = `${dir}/overwrite`
  await sbx.files.write(`${d}/existing.txt`, 'first')
  const w = await record(d)
  try {
    await sbx.files.write(`${d}/existing.txt`, 'second')
    await waitFor(() => w.has(FilesystemEventType.WRITE, 'existing.txt'), () => `WRITE existing.txt in ${w.dump()}`)
    assert.ok(!w.events.some((e) => e.name !== 'existing.txt'), `events for other names: ${w.dump()}`)
  } finally {
    await w.handle.stop()
  }
})

test('watchDir: create, write, rename, remove and chmod events with relative names', T, async () => {
  const d = `${dir}/flat`
  await sbx.files.makeDir(d)
  const w = await record(d)
  try {
    await sbx.files.write(`${d}/new.txt`, 'x')
    await waitFor(() => w.has(FilesystemEventType.CREATE, 'new.txt'), () => `CREATE new.txt in ${w.dump()}`)
    await sbx.commands.run(`echo more >> ${d}/new.txt`)
    await waitFor(() => w.has(FilesystemEventType.WRITE, 'new.txt'), () => `WRITE new.txt in ${w.dump()}`)
    await sbx.files.rename(`${d}/new.txt`, `${d}/renamed.txt`)
    await waitFor(() => w.has(FilesystemEventType.RENAME, 'new.txt'), () => `RENAME new.txt in ${w.dump()}`)
    await waitFor(() => w.has(FilesystemEventType.CREATE, 'renamed.txt'), () => `CREATE renamed.txt in ${w.dump()}`)
    await sbx.commands.run(`chmod 600 ${d}/renamed.txt`)
    await waitFor(() => w.has(FilesystemEventType.CHMOD, 'renamed.txt'), () => `CHMOD renamed.txt in ${w.dump()}`)
    await sbx.files.remove(`${d}/renamed.txt`)
    await waitFor(() => w.has(FilesystemEventType.REMOVE, 'renamed.txt'), () => `REMOVE renamed.txt in ${w.dump()}`)
  } finally {
    await w.handle.stop()
  }
})

test('watchDir: non-recursive watch ignores changes in subdirectories', T, async () => {
  const d = `${dir}/nonrec`
  await sbx.files.makeDir(`${d}/sub`)
  const w = await record(d)
  try {
    await sbx.files.write(`${d}/sub/inner.txt`, 'x')
    await sbx.files.write(`${d}/top.txt`, 'x')
    await waitFor(() => w.has(FilesystemEventType.CREATE, 'top.txt'), () => `CREATE top.txt in ${w.dump()}`)
    await sleep(300)
    assert.ok(!w.events.some((e) => e.name.includes('/')), () => `nested events reported: ${w.dump()}`)
  } finally {
    await w.handle.stop()
  }
})

test('watchDir recursive: events from an existing nested directory', T, async () => {
  const d = `${dir}/rec`
  await sbx.files.makeDir(`${d}/nested/deeper`)
  const w = await record(d, { recursive: true })
  try {
    await sbx.files.write(`${d}/nested/file.txt`, 'first')
    await waitFor(() => w.has(FilesystemEventType.CREATE, 'nested/file.txt'), () => `CREATE nested/file.txt in ${w.dump()}`)
    await sbx.commands.run(`echo more >> ${d}/nested/file.txt; : > ${d}/nested/deeper/x`)
    await waitFor(() => w.has(FilesystemEventType.WRITE, 'nested/file.txt'), () => `WRITE nested/file.txt in ${w.dump()}`)
    await waitFor(() => w.has(FilesystemEventType.CREATE, 'nested/deeper/x'), () => `CREATE nested/deeper/x in ${w.dump()}`)
  } finally {
    await w.handle.stop()
  }
})

test('watchDir recursive: a directory created after the watch is watched too', T, async () => {
  const d = `${dir}/recadd`
  await sbx.files.makeDir(d)
  const w = await record(d, { recursive: true })
  try {
    await sbx.files.makeDir(`${d}/later`)
    await waitFor(() => w.has(FilesystemEventType.CREATE, 'later'), () => `CREATE later in ${w.dump()}`)
    await sbx.files.write(`${d}/later/file.txt`, 'content')
    await waitFor(
      () => w.has(FilesystemEventType.WRITE, 'later/file.txt') || w.has(FilesystemEventType.CREATE, 'later/file.txt'),
      () => `an event for later/file.txt in ${w.dump()}`,
    )
    await sbx.files.makeDir(`${d}/later/deeper`)
    await waitFor(() => w.has(FilesystemEventType.CREATE, 'later/deeper'), () => `CREATE later/deeper in ${w.dump()}`)
    await sbx.files.write(`${d}/later/deeper/f.txt`, 'x')
    await waitFor(
      () => w.events.some((e) => e.name === 'later/deeper/f.txt'),
      () => `an event for later/deeper/f.txt in ${w.dump()}`,
    )
  } finally {
    await w.handle.stop()
  }
})

test('watchDir includeEntry: events carry EntryInfo', T, async () => {
  const d = `${dir}/entry`
  await sbx.files.makeDir(d)
  let got
  const handle = await sbx.files.watchDir(
    d,
    (e) => { if (e.type === FilesystemEventType.WRITE && e.name === 'f.txt') got ??= e },
    { includeEntry: true },
  )
  try {
    await sbx.commands.run(`echo second > ${d}/f.txt`)
    await waitFor(() => got, 'WRITE f.txt')
    assert.ok(got.entry, 'event has no entry')
    assert.equal(got.entry.name, 'f.txt')
    assert.equal(got.entry.path, `${d}/f.txt`)
    assert.equal(got.entry.type, FileType.FILE)
  } finally {
    await handle.stop()
  }
})

test('watchDir: two watchers on one directory; stopping one leaves the other working', T, async () => {
  const d = `${dir}/two`
  await sbx.files.makeDir(d)
  const w1 = await record(d)
  const w2 = await record(d)
  try {
    await sbx.files.write(`${d}/one.txt`, 'x')
    await waitFor(() => w1.has(FilesystemEventType.CREATE, 'one.txt'), () => `w1 CREATE one.txt in ${w1.dump()}`)
    await waitFor(() => w2.has(FilesystemEventType.CREATE, 'one.txt'), () => `w2 CREATE one.txt in ${w2.dump()}`)
    await w1.handle.stop()
    await sbx.files.write(`${d}/two.txt`, 'x')
    await waitFor(() => w2.has(FilesystemEventType.CREATE, 'two.txt'), () => `w2 CREATE two.txt in ${w2.dump()}`)
  } finally {
    await w1.handle.stop()
    await w2.handle.stop()
  }
})

test('watchDir: timeoutMs ends the watch with an error passed to onExit', T, async () => {
  const d = `${dir}/timeout`
  await sbx.files.makeDir(d)
  let exitErr = null
  const handle = await sbx.files.watchDir(d, () => {}, { timeoutMs: 1000, onExit: (err) => { exitErr = err ?? 'clean' } })
  try {
    await waitFor(() => exitErr !== null, 'watch to end after its 1 s timeout', 8_000)
  } finally {
    await handle.stop()
  }
})

test('watchDir: missing directory raises FileNotFoundError', T, async () => {
  await assert.rejects(sbx.files.watchDir(`${dir}/no-such-dir`, () => {}), (e) => {
    assert.ok(e instanceof FileNotFoundError, `expected FileNotFoundError, got ${e?.constructor?.name}: ${e?.message}`)
    return true
  })
})

test('watchDir: watching a file raises InvalidArgumentError', T, async () => {
  await sbx.files.write(`${dir}/a-file.txt`, 'x')
  await assert.rejects(sbx.files.watchDir(`${dir}/a-file.txt`, () => {}), (e) => {
    assert.ok(e instanceof InvalidArgumentError, `expected InvalidArgumentError, got ${e?.constructor?.name}: ${e?.message}`)
    return true
  })
})
