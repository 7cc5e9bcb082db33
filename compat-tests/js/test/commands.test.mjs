// commands.* through the real e2b JS SDK: process.Process Start/Connect/List/
// SendInput/CloseStdin/SendSignal over Connect JSON.
import { test, before } from 'node:test'
import assert from 'node:assert/strict'
import { CommandExitError, TimeoutError, InvalidArgumentError, NotFoundError, SandboxError } from 'e2b'
import { newSandbox, scratch, waitFor, processGone, cleanup, seqText, sleep, HOME, T } from './helpers.mjs'

let sbx
before(async () => {
  sbx = await newSandbox()
})

test('run: echo returns stdout and exit code 0', T, async () => {
  const r = await sbx.commands.run('echo "Hello, World!"')
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'Hello, World!\n')
  assert.equal(r.stderr, '')
})

test('run: special characters and multi-line output survive', T, async () => {
  const r = await sbx.commands.run(`printf '%s\\n' '!@#$%^&*()_+' 'line two' 'žluťoučký kůň 🐎'`)
  assert.equal(r.stdout, '!@#$%^&*()_+\nline two\nžluťoučký kůň 🐎\n')
})

test('run: is /bin/bash -l -c (bash features work)', T, async () => {
  const r = await sbx.commands.run('echo $BASH_VERSION | cut -c1; [[ 1 -eq 1 ]] && echo bashy')
  assert.match(r.stdout, /^\d\nbashy\n$/)
})

test('run: onStdout/onStderr callbacks receive both streams', T, async () => {
  let out = ''
  let err = ''
  const r = await sbx.commands.run('for i in 1 2 3; do echo out$i; echo err$i >&2; done', {
    onStdout: (d) => { out += d },
    onStderr: (d) => { err += d },
  })
  assert.equal(out, 'out1\nout2\nout3\n')
  assert.equal(err, 'err1\nerr2\nerr3\n')
  assert.equal(r.stdout, out)
  assert.equal(r.stderr, err)
})

test('run: output is streamed while the command is still running', T, async () => {
  const flag = scratch('flag')
  let out = ''
  let err = ''
  const h = await sbx.commands.run(
    `echo first; echo first-err >&2; while [ ! -e ${flag} ]; do sleep 0.05; done; echo second`,
    { background: true, onStdout: (d) => { out += d }, onStderr: (d) => { err += d } },
  )
  try {
    await waitFor(() => out === 'first\n' && err === 'first-err\n', 'first chunk before exit')
    assert.equal(h.exitCode, undefined, 'command must still be running')
    await sbx.commands.run(`touch ${flag}`)
    const r = await h.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'first\nsecond\n')
    assert.equal(out, 'first\nsecond\n')
  } finally {
    await h.kill().catch(() => {})
    await cleanup(sbx, flag)
  }
})

test('run: non-zero exit raises CommandExitError with stdout/stderr', T, async () => {
  await assert.rejects(
    sbx.commands.run('echo to-out; echo to-err >&2; exit 3'),
    (e) => {
      assert.ok(e instanceof CommandExitError, `expected CommandExitError, got ${e?.constructor?.name}: ${e?.message}`)
      assert.ok(e instanceof SandboxError)
      assert.equal(e.exitCode, 3)
      assert.equal(e.error, 'exit status 3') // Go's ProcessState text, as upstream envd
      assert.equal(e.stdout, 'to-out\n')
      assert.equal(e.stderr, 'to-err\n')
      return true
    },
  )
})

test('run: background handle wait() also raises CommandExitError', T, async () => {
  const h = await sbx.commands.run('echo partial; exit 7', { background: true })
  await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.exitCode === 7 && e.stdout === 'partial\n')
  assert.equal(h.exitCode, 7)
})

test('run: envs are passed to the command', T, async () => {
  const r = await sbx.commands.run('echo "$FOO|$BAR"', { envs: { FOO: 'bar', BAR: 'with spaces =x' } })
  assert.equal(r.stdout, 'bar|with spaces =x\n')
  // Per-command envs must not leak into the next command.
  const r2 = await sbx.commands.run('echo "[$FOO]"')
  assert.equal(r2.stdout, '[]\n')
})

test('run: HOME, USER, LOGNAME and PATH are set for the default user', T, async () => {
  const r = await sbx.commands.run('echo "$HOME|$USER|$LOGNAME"; command -v ls >/dev/null && echo path-ok')
  assert.equal(r.stdout, `${HOME}|user|user\npath-ok\n`)
})

test('run: default cwd is the user home; cwd option is honoured', T, async () => {
  assert.equal((await sbx.commands.run('pwd')).stdout, `${HOME}\n`)
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  assert.equal((await sbx.commands.run('pwd', { cwd: '/', user: 'root' })).stdout, '/\n')
})

test('run: relative and ~ cwd resolve against the user home', T, async () => {
  const d = scratch('cwd')
  const rel = d.slice(HOME.length + 1)
  try {
    await sbx.commands.run(`mkdir -p ${d}`)
    assert.equal((await sbx.commands.run('pwd', { cwd: rel })).stdout, `${d}\n`)
    assert.equal((await sbx.commands.run('pwd', { cwd: `~/${rel}` })).stdout, `${d}\n`)
  } finally {
    await cleanup(sbx, d)
  }
})

test('run: missing cwd is rejected (InvalidArgumentError)', T, async () => {
  await assert.rejects(
    sbx.commands.run('pwd', { cwd: '/definitely/not/here' }),
    (e) => {
      assert.ok(e instanceof InvalidArgumentError, `expected InvalidArgumentError, got ${e?.constructor?.name}: ${e?.message}`)
      return true
    },
  )
})

test('run: user root vs user "user" vs default (whoami, id)', T, async () => {
  assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
  assert.equal((await sbx.commands.run('whoami', { user: 'user' })).stdout, 'user\n')
  assert.equal((await sbx.commands.run('whoami', { user: 'root' })).stdout, 'root\n')
  assert.equal((await sbx.commands.run('echo $HOME', { user: 'root' })).stdout, '/root\n')
  assert.equal((await sbx.commands.run('pwd', { user: 'root' })).stdout, '/root\n')
  assert.equal((await sbx.commands.run('id -u', { user: 'root' })).stdout, '0\n')
  assert.notEqual((await sbx.commands.run('id -u')).stdout, '0\n')
})

test('run: 2 MiB of stdout arrives intact and in order', { timeout: 60_000 }, async () => {
  const expected = seqText(320_000)
  assert.ok(expected.length > 2 * 1024 * 1024)
  let streamed = ''
  const r = await sbx.commands.run('seq 1 320000', { onStdout: (d) => { streamed += d } })
  assert.equal(r.stdout.length, expected.length)
  assert.ok(r.stdout === expected, 'stdout differs from `seq 1 320000`')
  assert.ok(streamed === expected, 'onStdout chunks differ from `seq 1 320000`')
})

test('run: 2 MiB of multi-byte UTF-8 on stdout and stderr arrives intact', { timeout: 60_000 }, async () => {
  // 3-byte characters so chunk boundaries split code points.
  const r = await sbx.commands.run(
    `yes '€€€€€€€€€€' | head -n 70000 | tr -d '\\n'; yes 'řřřřřřřřřř' | head -n 30000 | tr -d '\\n' >&2`,
  )
  assert.equal(r.stdout, '€'.repeat(700_000))
  assert.equal(r.stderr, 'ř'.repeat(300_000))
})

test('timeout: command with timeoutMs 1000 that sleeps raises TimeoutError and is killed', T, async () => {
  const started = Date.now()
  const h = await sbx.commands.run('sleep 20; echo not-reached', { background: true, timeoutMs: 1000 })
  await assert.rejects(h.wait(), (e) => {
    assert.ok(e instanceof TimeoutError, `expected TimeoutError, got ${e?.constructor?.name}: ${e?.message}`)
    return true
  })
  assert.ok(Date.now() - started < 10_000, 'timeout took far longer than 1 s')
  // envd bounds the process lifetime by the deadline (Connect-Timeout-Ms).
  await waitFor(() => processGone(sbx, h.pid), `pid ${h.pid} to be killed by envd after its deadline`, 5_000)
})

test('timeout: foreground run with timeoutMs raises TimeoutError', T, async () => {
  const started = Date.now()
  await assert.rejects(sbx.commands.run('sleep 20', { timeoutMs: 1000 }), TimeoutError)
  assert.ok(Date.now() - started < 10_000)
})

test('timeout: a command finishing within timeoutMs succeeds', T, async () => {
  const r = await sbx.commands.run('sleep 0.2; echo ok', { timeoutMs: 5000 })
  assert.equal(r.stdout, 'ok\n')
})

test('stdin: sendStdin (pid and handle) + closeStdin deliver input and EOF', T, async () => {
  let out = ''
  const h = await sbx.commands.run('cat', { background: true, stdin: true, onStdout: (d) => { out += d } })
  try {
    await sbx.commands.sendStdin(h.pid, 'hello ')
    await h.sendStdin('world\n')
    await waitFor(() => out === 'hello world\n', 'cat to echo stdin')
    await sbx.commands.sendStdin(h.pid, new TextEncoder().encode('bytes ✓\n'))
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello world\nbytes ✓\n')
  } finally {
    await h.kill().catch(() => {})
  }
})

test('stdin: handle.closeStdin delivers EOF; binary bytes arrive unchanged', T, async () => {
  const h = await sbx.commands.run('od -An -v -tx1 | tr -s " \\n" " "', { background: true, stdin: true })
  try {
    await h.sendStdin(new Uint8Array([0, 1, 127, 128, 200, 255, 10]))
    await h.closeStdin()
    const r = await h.wait()
    assert.equal(r.stdout.trim(), '00 01 7f 80 c8 ff 0a')
  } finally {
    await h.kill().catch(() => {})
  }
})

test('stdin: without stdin:true the command sees EOF immediately', T, async () => {
  const r = await sbx.commands.run('cat; echo eof-seen', { timeoutMs: 5000 })
  assert.equal(r.stdout, 'eof-seen\n')
})

test('background + connect: a second handle receives later output and the result', T, async () => {
  const flag = scratch('flag')
  const h = await sbx.commands.run(
    `echo before; while [ ! -e ${flag} ]; do sleep 0.05; done; echo after; exit 0`,
    { background: true },
  )
  try {
    assert.ok(Number.isInteger(h.pid) && h.pid > 0)
    await waitFor(() => h.stdout === 'before\n', 'first output')
    await h.disconnect()
    let out = ''
    const c = await sbx.commands.connect(h.pid, { onStdout: (d) => { out += d } })
    assert.equal(c.pid, h.pid)
    await sbx.commands.run(`touch ${flag}`)
    const r = await c.wait()
    assert.equal(r.exitCode, 0)
    assert.match(r.stdout, /after\n$/)
    assert.match(out, /after\n$/)
  } finally {
    await sbx.commands.kill(h.pid).catch(() => {})
    await cleanup(sbx, flag)
  }
})

test('background: disconnecting does not kill the process', T, async () => {
  const h = await sbx.commands.run('sleep 30', { background: true })
  try {
    await h.disconnect()
    await sleep(300)
    assert.equal(await processGone(sbx, h.pid), false, 'process died after disconnect')
    assert.ok((await sbx.commands.list()).some((p) => p.pid === h.pid))
  } finally {
    await sbx.commands.kill(h.pid)
  }
})

test('connect: after the process exited, replays its end (exit code)', T, async () => {
  const h = await sbx.commands.run('echo done; exit 4', { background: true })
  await assert.rejects(h.wait(), (e) => e instanceof CommandExitError && e.exitCode === 4)
  const c = await sbx.commands.connect(h.pid)
  assert.equal(c.pid, h.pid)
  await assert.rejects(c.wait(), (e) => {
    assert.ok(e instanceof CommandExitError, `expected CommandExitError, got ${e?.constructor?.name}: ${e?.message}`)
    assert.equal(e.exitCode, 4)
    return true
  })
})

test('connect: unknown pid raises NotFoundError', T, async () => {
  await assert.rejects(sbx.commands.connect(999_999), (e) => {
    assert.ok(e instanceof NotFoundError, `expected NotFoundError, got ${e?.constructor?.name}: ${e?.message}`)
    return true
  })
})

test('kill: commands.kill SIGKILLs a background command', T, async () => {
  const h = await sbx.commands.run('sleep 30', { background: true })
  assert.equal(await sbx.commands.kill(h.pid), true)
  await assert.rejects(h.wait(), (e) => {
    assert.ok(e instanceof CommandExitError, `expected CommandExitError, got ${e?.constructor?.name}: ${e?.message}`)
    // Upstream envd: exit_code -1 and Go's ProcessState text for signal deaths.
    assert.equal(e.exitCode, -1)
    assert.equal(e.error, 'signal: killed')
    return true
  })
  await waitFor(() => processGone(sbx, h.pid), `pid ${h.pid} to be gone`, 5_000)
  assert.ok(!(await sbx.commands.list()).some((p) => p.pid === h.pid), 'killed process still listed')
})

test('kill: handle.kill() works and killing an unknown pid returns false', T, async () => {
  const h = await sbx.commands.run('sleep 30', { background: true })
  assert.equal(await h.kill(), true)
  await assert.rejects(h.wait(), CommandExitError)
  assert.equal(await sbx.commands.kill(999_999), false)
})

test('list: shows running commands with cmd, args, envs and cwd', T, async () => {
  const h1 = await sbx.commands.run('sleep 30', { background: true, envs: { LIST_MARK: 'yes' }, cwd: '/tmp' })
  const h2 = await sbx.commands.run('sleep 31', { background: true })
  try {
    const procs = await sbx.commands.list()
    assert.ok(Array.isArray(procs))
    const p1 = procs.find((p) => p.pid === h1.pid)
    const p2 = procs.find((p) => p.pid === h2.pid)
    assert.ok(p1, () => `pid ${h1.pid} not listed: ${JSON.stringify(procs)}`)
    assert.ok(p2, `pid ${h2.pid} not listed`)
    assert.equal(p1.cmd, '/bin/bash')
    assert.deepEqual(p1.args, ['-l', '-c', 'sleep 30'])
    assert.equal(p1.envs.LIST_MARK, 'yes')
    assert.equal(p1.cwd, '/tmp')
    assert.deepEqual(p2.args, ['-l', '-c', 'sleep 31'])
  } finally {
    await sbx.commands.kill(h1.pid)
    await sbx.commands.kill(h2.pid)
  }
})

test('concurrency: several commands run in parallel', T, async () => {
  const started = Date.now()
  const results = await Promise.all(
    [1, 2, 3, 4, 5].map((i) => sbx.commands.run(`sleep 1; echo ${i}`)),
  )
  assert.deepEqual(results.map((r) => r.stdout), ['1\n', '2\n', '3\n', '4\n', '5\n'])
  assert.ok(Date.now() - started < 4_500, 'commands did not run concurrently')
})
