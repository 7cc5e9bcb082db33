// sandbox.pty through the real e2b JS SDK: process.Process Start with a PTY,
// SendInput(pty), Update (resize), SendSignal and Connect.
import { test, before } from 'node:test'
import assert from 'node:assert/strict'
import { CommandExitError } from 'e2b'
import { newSandbox, waitFor, processGone, T } from './helpers.mjs'

let sbx
before(async () => {
  sbx = await newSandbox()
})

const enc = (s) => new TextEncoder().encode(s)

/** Creates a PTY that accumulates its output; out() returns it as text. */
async function terminal(opts = {}) {
  const decoder = new TextDecoder()
  let text = ''
  const handle = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { text += decoder.decode(d, { stream: true }) }, ...opts })
  return { handle, out: () => text }
}

test('pty: create, sendInput `echo hi` and see it in the output', T, async () => {
  const t = await terminal()
  try {
    assert.ok(t.handle.pid > 0)
    await sbx.pty.sendInput(t.handle.pid, enc('echo hi\n'))
    // `hi` alone on a line is the command's output, not the echoed input.
    await waitFor(() => /(^|[\r\n])hi\r?\n/.test(t.out()), () => `"hi" output in ${JSON.stringify(t.out())}`)
    await sbx.pty.sendInput(t.handle.pid, enc('echo $((40+2))\n'))
    await waitFor(() => t.out().includes('42'), () => `42 in ${JSON.stringify(t.out())}`)
  } finally {
    await sbx.pty.kill(t.handle.pid).catch(() => {})
  }
})

test('pty: is a real terminal running an interactive login bash', T, async () => {
  const t = await terminal()
  try {
    await sbx.pty.sendInput(t.handle.pid, enc('[ -t 0 ] && echo "tty-$((6*7))"; echo "term-$TERM"; echo "who-$(whoami)"; exit 0\n'))
    const r = await t.handle.wait()
    assert.equal(r.exitCode, 0)
    assert.match(t.out(), /tty-42/)
    assert.match(t.out(), /term-xterm-256color/)
    assert.match(t.out(), /who-user/)
  } finally {
    await sbx.pty.kill(t.handle.pid).catch(() => {})
  }
})

test('pty: exit ends the session with exit code 0', T, async () => {
  const t = await terminal()
  await sbx.pty.sendInput(t.handle.pid, enc('exit\n'))
  const r = await t.handle.wait()
  assert.equal(r.exitCode, 0)
  assert.equal(t.handle.exitCode, 0)
})

test('pty: bulk output (seq 1 50000) arrives complete and in order', T, async () => {
  const t = await terminal()
  await sbx.pty.sendInput(t.handle.pid, enc('seq 1 50000; exit\n'))
  const r = await t.handle.wait()
  assert.equal(r.exitCode, 0)
  const plain = t.out().replace(/\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r/g, '')
  const nums = plain.split('\n').filter((l) => /^\d+$/.test(l))
  assert.equal(nums.length, 50_000)
  assert.ok(nums.every((n, i) => n === String(i + 1)), 'lines out of order or corrupted')
})

test('pty: user root, cwd and envs options', T, async () => {
  const t = await terminal({ user: 'root', cwd: '/tmp', envs: { PTY_MARK: 'marked' } })
  try {
    await sbx.pty.sendInput(t.handle.pid, enc('echo "u-$(whoami) d-$(pwd) m-$PTY_MARK"; exit\n'))
    await t.handle.wait()
    assert.match(t.out(), /u-root d-\/tmp m-marked/)
  } finally {
    await sbx.pty.kill(t.handle.pid).catch(() => {})
  }
})

test('pty: resize changes the terminal size (stty size)', T, async () => {
  const t = await terminal({ cols: 80, rows: 24 })
  try {
    await sbx.pty.sendInput(t.handle.pid, enc('echo "size-$(stty size | tr " " x)"\n'))
    await waitFor(() => t.out().includes('size-24x80'), () => `size-24x80 in ${JSON.stringify(t.out())}`)
    await sbx.pty.resize(t.handle.pid, { cols: 100, rows: 30 })
    await sbx.pty.sendInput(t.handle.pid, enc('echo "size-$(stty size | tr " " x)"\n'))
    await waitFor(() => t.out().includes('size-30x100'), () => `size-30x100 in ${JSON.stringify(t.out())}`)
  } finally {
    await sbx.pty.kill(t.handle.pid).catch(() => {})
  }
})

test('pty: kill returns true, ends the session and the process is gone', T, async () => {
  const t = await terminal()
  assert.equal(await sbx.pty.kill(t.handle.pid), true)
  await assert.rejects(t.handle.wait(), (e) => {
    assert.ok(e instanceof CommandExitError, `expected CommandExitError, got ${e?.constructor?.name}: ${e?.message}`)
    assert.notEqual(e.exitCode, 0)
    return true
  })
  await waitFor(() => processGone(sbx, t.handle.pid), `pty pid ${t.handle.pid} to be gone`, 5_000)
  assert.equal(await sbx.pty.kill(999_999), false)
})

test('pty: listed by commands.list and reconnectable with pty.connect', T, async () => {
  const t = await terminal()
  try {
    const p = (await sbx.commands.list()).find((x) => x.pid === t.handle.pid)
    assert.ok(p, 'pty not listed')
    assert.equal(p.cmd, '/bin/bash')
    assert.deepEqual(p.args, ['-i', '-l'])
    await t.handle.disconnect()
    let text = ''
    const decoder = new TextDecoder()
    const c = await sbx.pty.connect(t.handle.pid, { onData: (d) => { text += decoder.decode(d, { stream: true }) } })
    assert.equal(c.pid, t.handle.pid)
    await sbx.pty.sendInput(t.handle.pid, enc('echo "re$((1+1))connected"\n'))
    await waitFor(() => text.includes('re2connected'), () => `re2connected in ${JSON.stringify(text)}`)
    await sbx.pty.sendInput(t.handle.pid, enc('exit\n'))
    const r = await c.wait()
    assert.equal(r.exitCode, 0)
  } finally {
    await sbx.pty.kill(t.handle.pid).catch(() => {})
  }
})
