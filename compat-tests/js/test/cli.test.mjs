// E2B's CLI (npm @e2b/cli, pinned in compat-tests/cli) against sandboxd: the
// template commands that talk to the API. `e2b template init` and
// `migrate` are local and need no server.
import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { randomBytes } from 'node:crypto'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { describe, test } from 'node:test'
import { SANDBOXD, newSandboxFrom } from './helpers.mjs'

const run = promisify(execFile)
const here = path.dirname(fileURLToPath(import.meta.url))
const CLI = path.join(here, '..', '..', 'cli', 'node_modules', '.bin', 'e2b')

// The CLI reads E2B_API_URL and E2B_DOMAIN (and E2B_API_KEY) as the SDKs do.
async function e2b(...args) {
  const { stdout } = await run(CLI, args, { env: process.env, timeout: 200_000 })
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
