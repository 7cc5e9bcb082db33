// E2B's CLI (npm @e2b/cli, pinned in compat-tests/cli) against sandboxd:
// every command that talks to the API. `e2b template init` and `migrate`
// are local and need no server; `e2b auth` logs in to e2b.dev's website
// (E2B_API_KEY is what a self-hosted server takes instead).
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { randomBytes } from 'node:crypto'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { describe, test } from 'node:test'
import { SANDBOXD, newSandbox, newSandboxFrom, waitFor } from './helpers.mjs'

const run = promisify(execFile)
const here = path.dirname(fileURLToPath(import.meta.url))
const CLI = path.join(here, '..', '..', 'cli', 'node_modules', '.bin', 'e2b')

// The CLI reads E2B_API_URL and E2B_DOMAIN (and E2B_API_KEY) as the SDKs do.
// Its stdin ends at once: `sandbox exec` forwards a stdin that is not a
// terminal to the command, and would wait for its end.
async function e2b(...args) {
  const p = run(CLI, args, { env: process.env, timeout: 200_000 })
  p.child.stdin.end()
  const { stdout } = await p
  return stdout
}

describe('e2b CLI template commands', { skip: SANDBOXD ? false : 'sandboxd mode only' }, () => {
  const name = `cli-${randomBytes(4).toString('hex')}`
  test('create from a Dockerfile, list, publish, unpublish, delete', { timeout: 240_000 }, async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'compat-cli-'))
    writeFileSync(path.join(dir, 'hello.txt'), 'from the CLI\n')
    writeFileSync(path.join(dir, 'e2b.Dockerfile'), 'FROM e2bdev/base\nCOPY hello.txt /home/user/hello.txt\nRUN echo built > /home/user/built.txt\n')
    await e2b('template', 'create', name, '--path', dir)

    const sbx = await newSandboxFrom(name)
    assert.equal(await sbx.files.read('/home/user/hello.txt'), 'from the CLI\n')
    assert.equal((await sbx.files.read('/home/user/built.txt')).trim(), 'built')

    const row = (out) => out.split('\n').find((l) => l.includes(name)) ?? ''
    assert.match(row(await e2b('template', 'list')), /Private/)
    await e2b('template', 'publish', name, '-y')
    assert.match(row(await e2b('template', 'list')), /Public/)
    await e2b('template', 'unpublish', name, '-y')
    assert.match(row(await e2b('template', 'list')), /Private/)
    await e2b('template', 'delete', name, '-y')
    assert.equal(row(await e2b('template', 'list')), '')
  })
})

// The terminal commands (connect, create) need a terminal: script(1) gives
// them one, and their shell reads its commands from stdin.
async function e2bInTerminal(input, ...args) {
  const cmd = [CLI, ...args].map((a) => `'${a}'`).join(' ')
  const child = execFile('script', ['-qec', cmd, '/dev/null'], { env: process.env, timeout: 60_000 })
  let out = ''
  child.stdout.on('data', (d) => (out += d))
  child.stdin.end(input)
  await new Promise((resolve, reject) => child.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`exit ${code}: ${out}`)))))
  return out.replaceAll('\r', '')
}

describe('e2b CLI sandbox commands', { skip: SANDBOXD ? false : 'sandboxd mode only' }, () => {
  test('list, info, exec, logs, metrics, pause, resume, snapshots, connect, kill', { timeout: 180_000 }, async () => {
    const sbx = await newSandbox({ metadata: { via: 'cli-test' } })
    const id = sbx.sandboxId
    const row = (out) => out.split('\n').find((l) => l.includes(id)) ?? ''

    assert.match(row(await e2b('sandbox', 'list')), /Running/)
    const listed = JSON.parse(await e2b('sandbox', 'list', '--format', 'json'))
    assert.deepEqual(listed.find((s) => s.sandboxId === id)?.metadata, { via: 'cli-test' })
    const info = await e2b('sandbox', 'info', id)
    assert.match(info, /Template ID: base/)
    assert.match(info, /State: running/)

    assert.equal((await e2b('sandbox', 'exec', id, '--', 'sh', '-c', 'echo $((6*7)); id -un')).trim(), '42\nuser')

    // The v1 logs route's raw JSON records, parsed and printed by the CLI.
    const logs = (await e2b('sandbox', 'logs', id, '--format', 'json')).split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l))
    assert.ok(logs.some((l) => l.message === 'sandbox created' && l.level === 'info' && l.action === 'create'), JSON.stringify(logs))

    let metrics = ''
    await waitFor(async () => /CPU: .*Memory: .*Disk:/.test((metrics = await e2b('sandbox', 'metrics', id))), () => `metrics: ${metrics}`, 20_000)

    await e2b('sandbox', 'pause', id)
    assert.match(row(await e2b('sandbox', 'list', '--state', 'paused')), /Paused/)
    await e2b('sandbox', 'resume', id)
    assert.equal((await sbx.commands.run('echo back')).stdout, 'back\n')

    const created = await e2b('sandbox', 'snapshot', 'create', id)
    const snap = created.match(/Created snapshot (\S+)/)?.[1]
    assert.ok(snap, created)
    assert.match(await e2b('sandbox', 'snapshot', 'list'), new RegExp(snap.replace(':', '\\:')))
    await e2b('sandbox', 'snapshot', 'delete', snap)
    assert.doesNotMatch(await e2b('sandbox', 'snapshot', 'list'), new RegExp(snap.replace(':', '\\:')))

    const term = await e2bInTerminal('echo CONNECTED-$((6*7))\nexit\n', 'sandbox', 'connect', id)
    assert.match(term, /CONNECTED-42/)

    await e2b('sandbox', 'kill', id)
    assert.equal(row(await e2b('sandbox', 'list')), '')
  })

  test('create opens a terminal in a new sandbox', { timeout: 120_000 }, async () => {
    const term = await e2bInTerminal('echo IN-$(hostname)-$((6*7))\nexit\n', 'sandbox', 'create', 'base')
    assert.match(term, /IN-.*-42/)
    // The CLI kills the sandbox it made when the terminal closes.
    const id = term.match(/IN-(\w+)-42/)?.[1]
    if (id) await waitFor(async () => !(await e2b('sandbox', 'list')).includes(id), () => `${id} still listed`, 20_000)
  })
})
