// Templates built through the SDK's Template builder (build system v2)
// against sandboxd: every step kind, COPY uploads, start and ready
// commands, cache hits, failures, tags, exists, background builds.
import assert from 'node:assert/strict'
import { mkdtempSync, writeFileSync, mkdirSync, chmodSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { randomBytes } from 'node:crypto'
import { describe, test } from 'node:test'
import { Template, Sandbox, waitForPort, waitForFile, BuildError } from 'e2b'
import { SANDBOXD, SANDBOXD_ONLY, newSandboxFrom } from './helpers.mjs'

const BUILD = { ...SANDBOXD_ONLY, timeout: 240_000 }
const unique = (p) => `${p}-${randomBytes(4).toString('hex')}`

function context() {
  const dir = mkdtempSync(path.join(tmpdir(), 'compat-template-'))
  mkdirSync(path.join(dir, 'app'))
  writeFileSync(path.join(dir, 'app', 'main.py'), 'print("hello from the template")\n')
  writeFileSync(path.join(dir, 'config.json'), '{"mode":"test"}\n')
  writeFileSync(path.join(dir, 'run.sh'), '#!/bin/sh\necho run\n')
  chmodSync(path.join(dir, 'run.sh'), 0o755)
  return dir
}

describe('Template builder', { skip: SANDBOXD ? false : 'sandboxd mode only' }, () => {
  const name = unique('js-app')
  const dir = context()
  const tpl = () =>
    Template({ fileContextPath: dir })
      .fromBaseImage()
      .setEnvs({ APP_MODE: 'compat', GREETING: 'hi' })
      .setWorkdir('/home/user/app')
      .copy('app', './')
      .copy('config.json', '/home/user/config/config.json')
      .copy('run.sh', '/home/user/bin/', { mode: 0o755 })
      .runCmd('echo "$GREETING from $(id -un)" > built.txt')
      .runCmd('touch /opt/root-was-here', { user: 'root' })
      .setStartCmd('sleep 1 && python3 -m http.server 8123 --bind 127.0.0.1', waitForPort(8123))

  test('builds with logs, and its sandboxes have the files, env, workdir and a ready start command', BUILD, async () => {
    const logs = []
    const info = await Template.build(tpl(), `${name}:v1`, { onBuildLogs: (e) => logs.push(e.message) })
    assert.ok(info.name.startsWith(name), info.name)
    assert.ok(info.templateId && info.buildId)
    assert.ok(logs.some((l) => l.includes('RUN')), `logs: ${logs.join('\n')}`)
    assert.ok(await Template.exists(name))

    const sbx = await newSandboxFrom(name)
    assert.equal((await sbx.getInfo()).templateId, info.templateId)
    const r = await sbx.commands.run(
      'cat built.txt && python3 main.py && cat ../config/config.json && ls -l ../bin/run.sh | cut -c1-10 && echo $APP_MODE && pwd && stat -c %U /opt/root-was-here')
    assert.equal(r.stdout, 'hi from user\nhello from the template\n{"mode":"test"}\n-rwxr-xr-x\ncompat\n/home/user/app\nroot\n')
    // The start command was ready before create returned: the port answers at once.
    const port = await sbx.commands.run('ss -Htln sport = :8123 | wc -l')
    assert.equal(port.stdout.trim(), '1')
    const byTag = await newSandboxFrom(`${name}:v1`)
    assert.equal((await byTag.files.read('/home/user/app/built.txt')).trim(), 'hi from user')
  })

  test('an unchanged rebuild is all cache hits', BUILD, async () => {
    const logs = []
    await Template.build(tpl(), name, { onBuildLogs: (e) => logs.push(e.message) })
    const cached = logs.filter((l) => l.startsWith('CACHED'))
    assert.ok(cached.length >= 5, `expected cached steps, logs:\n${logs.join('\n')}`)
  })

  test('tags: assign, list, remove', BUILD, async () => {
    await Template.assignTags(`${name}:v1`, ['stable'])
    const tags = (await Template.getTags(name)).map((t) => t.tag).sort()
    assert.ok(tags.includes('stable') && tags.includes('v1'), `tags ${tags}`)
    const sbx = await newSandboxFrom(`${name}:stable`)
    assert.equal((await sbx.files.read('/home/user/app/built.txt')).trim(), 'hi from user')
    await Template.removeTags(name, 'stable')
    await assert.rejects(Sandbox.create(`${name}:stable`))
  })

  test('a failing step throws BuildError naming it', BUILD, async () => {
    const bad = Template().fromTemplate('base').runCmd('echo fine').runCmd('echo broken-step >&2; exit 7')
    await assert.rejects(Template.build(bad, unique('js-bad')), (err) => {
      assert.ok(err instanceof BuildError, `got ${err}`)
      assert.match(err.message, /exit code 7/)
      assert.match(err.message, /broken-step/)
      return true
    })
  })

  test('a build in the background, polled', BUILD, async () => {
    const n = unique('js-bg')
    const info = await Template.buildInBackground(
      Template().fromTemplate('base').runCmd('echo bg > /tmp/bg.txt').setStartCmd('touch /tmp/ready && sleep 100000', waitForFile('/tmp/ready')), n)
    let st
    for (let i = 0; i < 600; i++) {
      st = await Template.getBuildStatus(info)
      if (st.status === 'ready' || st.status === 'error') break
      await new Promise((r) => setTimeout(r, 200))
    }
    assert.equal(st.status, 'ready', JSON.stringify(st.reason))
    const sbx = await newSandboxFrom(n)
    assert.equal((await sbx.files.read('/tmp/bg.txt')).trim(), 'bg')
  })

  test('a template from another template', BUILD, async () => {
    const child = unique('js-child')
    await Template.build(Template().fromTemplate(name).runCmd('cat built.txt > child.txt'), child)
    const sbx = await newSandboxFrom(child)
    assert.equal((await sbx.files.read('/home/user/app/child.txt')).trim(), 'hi from user')
  })

  const REG = process.env.COMPAT_REGISTRY
  const PRIV = process.env.COMPAT_PRIVATE_REGISTRY
  test('from an image in a registry, and from a private one with credentials', BUILD, async () => {
    assert.ok(REG && PRIV, 'run.sh sets COMPAT_REGISTRY and COMPAT_PRIVATE_REGISTRY')
    const n = unique('js-img')
    await Template.build(Template().fromImage(`${REG}/sandboxd-test/busybox:1`).runCmd('echo "$FROM_IMAGE" > /home/user/from.txt'), n)
    const sbx = await newSandboxFrom(n)
    const r = await sbx.commands.run('cat /home/user/from.txt; id -un; echo $FROM_IMAGE')
    assert.equal(r.stdout, 'yes\nuser\nyes\n')

    const creds = { username: process.env.COMPAT_REGISTRY_USER, password: process.env.COMPAT_REGISTRY_PASS }
    await Template.build(Template().fromImage(`${PRIV}/sandboxd-test/busybox:1`, creds).runCmd('true'), unique('js-priv'))
    await assert.rejects(
      Template.build(Template().fromImage(`${PRIV}/sandboxd-test/busybox:1`, { ...creds, password: 'wrong' }), unique('js-priv-bad')),
      (err) => err instanceof BuildError && /refused/.test(err.message))
  })

  test('exists is false for a name never built', SANDBOXD_ONLY, async () => {
    assert.equal(await Template.exists(unique('never')), false)
  })
})
