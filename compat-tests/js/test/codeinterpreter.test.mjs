// E2B's code-interpreter SDK (@e2b/code-interpreter) against sandboxd: the
// template code-interpreter-v1 that sandboxd builds itself at start, and
// its server on port 49999 through the proxy. Results, streaming, errors,
// contexts, charts, DataFrames, env vars, timeouts, languages (Python, Bash,
// JavaScript and TypeScript).
import assert from 'node:assert/strict'
import { after, before, describe, test as nodeTest } from 'node:test'
import { Sandbox } from '@e2b/code-interpreter'
import { NotFoundError, SandboxError, TimeoutError, InvalidArgumentError } from 'e2b'
import { API_URL, SANDBOXD } from './helpers.mjs'

const T = { timeout: 120_000 }
// runCode leaves its request timer (60 s) running when the answer is an
// error status, which keeps node alive past the file's time limit: calls
// expected to fail that way turn it off.
const NO_REQ_TIMER = { requestTimeoutMs: 0 }
const TEMPLATE = 'code-interpreter-v1'

/**
 * Waits for sandboxd's background build of code-interpreter-v1 (a fresh
 * data dir builds it: pip from PyPI, minutes). A failed build fails at once
 * with its reason.
 */
async function templateReady(limitMs = 20 * 60_000) {
  const deadline = Date.now() + limitMs
  let last = 'not listed yet'
  while (Date.now() < deadline) {
    const res = await fetch(`${API_URL}/templates`, { headers: { 'X-API-Key': process.env.E2B_API_KEY } })
    assert.equal(res.status, 200, await res.clone().text())
    const tpl = (await res.json()).find((t) => (t.aliases || []).includes(TEMPLATE))
    if (tpl) {
      last = tpl.buildStatus
      if (last === 'ready') return
      if (last === 'error') {
        const st = await fetch(`${API_URL}/templates/${tpl.templateID}/builds/${tpl.buildID}/status`, {
          headers: { 'X-API-Key': process.env.E2B_API_KEY },
        })
        assert.fail(`${TEMPLATE} build failed: ${await st.text()}`)
      }
    }
    await new Promise((r) => setTimeout(r, 2000))
  }
  assert.fail(`${TEMPLATE} not built within ${limitMs / 1000} s (last: ${last})`)
}

// sandboxd builds the template with its template builder, on either
// backend.
const skip = !SANDBOXD ? 'sandboxd mode only (the template is sandboxd-built)' : false

// The Incus test image has no npm, so its template has no Deno kernel
// (run.sh says so with COMPAT_NO_JS_KERNEL=1 in the incus mode).
const JS = process.env.COMPAT_NO_JS_KERNEL === '1'
  ? { ...T, skip: 'no JavaScript/TypeScript kernel on this backend: its base has no npm' }
  : T

describe('code interpreter', { skip }, () => {
  let sbx
  // A failed test prints the server's and Jupyter's logs, which die with
  // the sandbox: a rare lost result (a JS env var read as nothing) was
  // undiagnosable without them.
  const test = (name, opts, fn) => nodeTest(name, opts, async (t) => {
    try {
      return await fn(t)
    } catch (err) {
      for (const path of ['/tmp/code-interpreter.log', '/tmp/jupyter.log']) {
        const text = await sbx?.files.read(path, { user: 'root' }).catch((e) => `(unreadable: ${e.message})`)
        console.error(`--- ${path} of ${sbx?.sandboxId}, last 200 lines, after "${name}" failed:\n${String(text).split('\n').slice(-200).join('\n')}`)
      }
      throw err
    }
  })
  before(async () => {
    await templateReady()
    sbx = await Sandbox.create({ timeoutMs: 600_000, envs: { SBX_LEVEL: 'sandbox' } })
  }, { timeout: 21 * 60_000 })
  after(async () => {
    await sbx?.kill().catch(() => {})
  })

  test('1+1 is the main result "2"', T, async () => {
    const ex = await sbx.runCode('1+1')
    assert.equal(ex.text, '2')
    assert.equal(ex.results.length, 1)
    assert.equal(ex.results[0].isMainResult, true)
    assert.equal(ex.error, undefined)
    assert.ok(Number.isInteger(ex.executionCount), `executionCount ${ex.executionCount}`)
  })

  test('state stays between calls in the default context', T, async () => {
    await sbx.runCode('counter = 40')
    const ex = await sbx.runCode('counter += 2; counter')
    assert.equal(ex.text, '42')
  })

  test('stdout and stderr stream to the callbacks while the code runs', T, async () => {
    const seen = []
    const start = Date.now()
    const ex = await sbx.runCode(
      'import sys, time\nprint("first", flush=True)\ntime.sleep(1.5)\nprint("oops", file=sys.stderr, flush=True)\nprint("second")',
      {
        onStdout: (m) => seen.push(['out', m.line, Date.now() - start]),
        onStderr: (m) => seen.push(['err', m.line, Date.now() - start]),
      },
    )
    const done = Date.now() - start
    assert.deepEqual(seen.map(([k, l]) => [k, l]), [['out', 'first\n'], ['err', 'oops\n'], ['out', 'second\n']])
    assert.ok(done - seen[0][2] >= 1000, `the first line came ${seen[0][2]} ms in, the end ${done} ms: not streamed`)
    assert.deepEqual(ex.logs, { stdout: ['first\n', 'second\n'], stderr: ['oops\n'] })
  })

  test('an exception is the execution error with name, value and traceback', T, async () => {
    let cb
    const ex = await sbx.runCode('x = 1\n1/0', { onError: (e) => (cb = e) })
    assert.equal(ex.error.name, 'ZeroDivisionError')
    assert.equal(ex.error.value, 'division by zero')
    assert.match(ex.error.traceback, /ZeroDivisionError/)
    assert.equal(cb?.name, 'ZeroDivisionError')
    assert.equal(ex.results.length, 0)
  })

  test('contexts: create, list, separate state, restart, remove', T, async () => {
    const a = await sbx.createCodeContext()
    assert.equal(a.language, 'python')
    assert.equal(a.cwd, '/home/user')
    assert.ok(a.id)
    const b = await sbx.createCodeContext({ cwd: '/tmp', language: 'python' })
    assert.equal(b.cwd, '/tmp')
    const ids = (await sbx.listCodeContexts()).map((c) => c.id)
    assert.ok(ids.includes(a.id) && ids.includes(b.id), `list: ${ids}`)

    await sbx.runCode('only_in_a = "a"', { context: a })
    assert.equal((await sbx.runCode('only_in_a', { context: a })).text, 'a')
    const inB = await sbx.runCode('only_in_a', { context: b })
    assert.equal(inB.error?.name, 'NameError')
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: b })).text, '/tmp')

    await sbx.restartCodeContext(a)
    assert.equal((await sbx.runCode('only_in_a', { context: a })).error?.name, 'NameError')

    await sbx.removeCodeContext(a)
    await sbx.removeCodeContext(b.id)
    const left = (await sbx.listCodeContexts()).map((c) => c.id)
    assert.ok(!left.includes(a.id) && !left.includes(b.id), `after remove: ${left}`)
    await assert.rejects(sbx.runCode('1', { context: a, ...NO_REQ_TIMER }), NotFoundError)
    await assert.rejects(sbx.restartCodeContext(a), NotFoundError)
  })

  test('a matplotlib figure is a png and a chart', T, async () => {
    const ex = await sbx.runCode(`
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [1, 4, 9], label="squares")
plt.title("Squares")
plt.xlabel("n")
plt.ylabel("n squared")
plt.show()
`)
    assert.equal(ex.error, undefined)
    const r = ex.results.find((x) => x.png)
    assert.ok(r, `results: ${JSON.stringify(ex.results.map((x) => x.formats()))}`)
    assert.equal(Buffer.from(r.png, 'base64').subarray(1, 4).toString(), 'PNG')
    assert.equal(r.chart.type, 'line')
    assert.equal(r.chart.title, 'Squares')
    assert.equal(r.chart.x_label, 'n')
    assert.deepEqual(r.chart.elements[0].points, [[1, 1], [2, 4], [3, 9]])
    assert.equal(r.chart.elements[0].label, 'squares')

    const bar = await sbx.runCode('plt.bar(["a", "b"], [3, 5]); plt.show()')
    const chart = bar.results.find((x) => x.chart).chart
    assert.equal(chart.type, 'bar')
    assert.deepEqual(chart.elements.map((e) => [e.label, e.value]), [['a', 3], ['b', 5]])
  })

  test('a DataFrame is data and html', T, async () => {
    const ex = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2], "b": ["x", "y"]})')
    const r = ex.results[0]
    assert.equal(r.isMainResult, true)
    assert.deepEqual(r.data, { a: [1, 2], b: ['x', 'y'] })
    assert.match(r.html, /<table/)
    assert.ok(r.formats().includes('data') && r.formats().includes('html'), r.formats().join())
  })

  test("env vars: the sandbox's, per call (winning, then undone)", T, async () => {
    assert.equal((await sbx.runCode('import os; os.environ.get("SBX_LEVEL")')).text, 'sandbox')
    const ex = await sbx.runCode('os.environ["SBX_LEVEL"] + "/" + os.environ["CALL_ONLY"]', {
      envs: { SBX_LEVEL: 'call', CALL_ONLY: 'yes' },
    })
    assert.equal(ex.text, 'call/yes')
    assert.equal((await sbx.runCode('os.environ.get("SBX_LEVEL"), os.environ.get("CALL_ONLY")')).text, "('sandbox', None)")
  })

  test('a timeout stops the code; the context is usable at once', T, async () => {
    const start = Date.now()
    await assert.rejects(sbx.runCode('while True: pass', { timeoutMs: 2000 }), TimeoutError)
    assert.ok(Date.now() - start < 10_000)
    const after = Date.now()
    assert.equal((await sbx.runCode('1+2')).text, '3')
    assert.ok(Date.now() - after < 5000, `the next run took ${Date.now() - after} ms: the loop was not interrupted`)
  })

  test('a kernel crash is an error and the next run gets a fresh kernel', T, async () => {
    const ctx = await sbx.createCodeContext()
    await sbx.runCode('state = 1', { context: ctx })
    const ex = await sbx.runCode('import os; os._exit(1)', { context: ctx })
    assert.ok(ex.error, 'no error for a dead kernel')
    const next = await sbx.runCode('"state" in dir()', { context: ctx })
    assert.equal(next.text, 'False')
    await sbx.removeCodeContext(ctx)
  })

  test('bash runs; an unknown language is refused; context and language together are refused', T, async () => {
    const ex = await sbx.runCode('echo hi from bash | tr a-z A-Z; pwd', { language: 'bash' })
    assert.equal(ex.logs.stdout.join(''), 'HI FROM BASH\n/home/user\n')
    await assert.rejects(sbx.runCode('1', { language: 'cobol', ...NO_REQ_TIMER }), SandboxError)
    // R has no kernel in the template.
    await assert.rejects(sbx.runCode('1', { language: 'r', ...NO_REQ_TIMER }), SandboxError)
    const ctx = await sbx.createCodeContext()
    await assert.rejects(sbx.runCode('1', { context: ctx, language: 'python' }), InvalidArgumentError)
    await sbx.removeCodeContext(ctx)
  })

  // JavaScript and TypeScript run on the template's Deno kernel.
  test('JavaScript (js, javascript): the last expression is the result, console output streams, a throw is the error', JS, async () => {
    const ex = await sbx.runCode('1+1', { language: 'js' })
    assert.equal(ex.text, '2')
    assert.equal(ex.results.length, 1)
    assert.equal(ex.results[0].isMainResult, true)
    assert.equal(ex.error, undefined)

    const out = await sbx.runCode('console.log("to", "stdout"); console.error("to stderr"); ["a", "b"].join("")', { language: 'javascript' })
    assert.deepEqual(out.logs, { stdout: ['to stdout\n'], stderr: ['to stderr\n'] })
    assert.equal(out.text, 'ab')

    let cb
    const err = await sbx.runCode('const boom = () => { throw new TypeError("bad input") }\nboom()', { language: 'js', onError: (e) => (cb = e) })
    assert.equal(err.error?.name, 'TypeError')
    assert.equal(err.error.value, 'bad input')
    assert.match(err.error.traceback, /bad input/)
    assert.equal(cb?.name, 'TypeError')
    assert.equal(err.results.length, 0)
    assert.equal((await sbx.runCode('notDefinedAnywhere', { language: 'js' })).error?.name, 'ReferenceError')
    // The default JavaScript context keeps its state.
    await sbx.runCode('let jsCounter = 40', { language: 'js' })
    assert.equal((await sbx.runCode('jsCounter += 2; jsCounter', { language: 'javascript' })).text, '42')
  })

  test('TypeScript (ts, typescript): types, interfaces, await, node: modules', JS, async () => {
    assert.equal((await sbx.runCode('const n: number = 41; n + 1', { language: 'ts' })).text, '42')
    const ex = await sbx.runCode(
      'interface Point { x: number; y: number }\nconst p: Point = { x: 3, y: 4 }\nconst len = (q: Point): number => Math.hypot(q.x, q.y)\nawait new Promise((r) => setTimeout(r, 10))\nlen(p)',
      { language: 'typescript' },
    )
    assert.equal(ex.error, undefined, JSON.stringify(ex.error))
    assert.equal(ex.text, '5')
    assert.equal((await sbx.runCode('import { join } from "node:path"; join("a", "b")', { language: 'ts' })).text, 'a/b')
    assert.equal((await sbx.runCode('throw new RangeError("too far")', { language: 'ts' })).error?.name, 'RangeError')
  })

  test("JavaScript and TypeScript env vars: the sandbox's, per call (winning, then undone)", JS, async () => {
    for (const language of ['js', 'ts']) {
      assert.equal((await sbx.runCode('process.env.SBX_LEVEL', { language })).text, 'sandbox', language)
      const ex = await sbx.runCode('process.env.SBX_LEVEL + "/" + process.env.CALL_ONLY', { language, envs: { SBX_LEVEL: 'call', CALL_ONLY: 'yes' } })
      assert.equal(ex.text, 'call/yes', language)
      assert.equal((await sbx.runCode('`${process.env.SBX_LEVEL} ${process.env.CALL_ONLY}`', { language })).text, 'sandbox undefined', language)
    }
  })

  test('a TypeScript context keeps its state and cwd; a JavaScript one is apart', JS, async () => {
    const ts = await sbx.createCodeContext({ language: 'ts', cwd: '/tmp' })
    assert.equal(ts.language, 'typescript')
    assert.equal(ts.cwd, '/tmp')
    const js = await sbx.createCodeContext({ language: 'javascript' })
    assert.equal(js.language, 'javascript')
    await sbx.runCode('let kept: string[] = ["x"]', { context: ts })
    await sbx.runCode('kept.push("y")', { context: ts })
    assert.equal((await sbx.runCode('kept.join(",")', { context: ts })).text, 'x,y')
    assert.equal((await sbx.runCode('process.cwd()', { context: ts })).text, '/tmp')
    assert.equal((await sbx.runCode('typeof kept', { context: js })).text, 'undefined')
    assert.equal((await sbx.runCode('process.cwd()', { context: js })).text, '/home/user')
    await sbx.restartCodeContext(ts)
    assert.equal((await sbx.runCode('kept', { context: ts })).error?.name, 'ReferenceError')
    await sbx.removeCodeContext(ts)
    await sbx.removeCodeContext(js)
  })

  // 10 MB: the JS SDK's line splitting is slow on long lines (50 MB take it
  // 40 s); the Python suite sends 50 MB.
  test('10 MB of output arrives whole and the server survives', T, async () => {
    let n = 0
    const ex = await sbx.runCode('for _ in range(10):\n    print("y" * 1_000_000)', { onStdout: (m) => (n += m.line.length) })
    assert.equal(ex.error, undefined)
    assert.equal(n, 10 * 1_000_001)
    assert.equal((await sbx.runCode('21*2')).text, '42')
  })
})
