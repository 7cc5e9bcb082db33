"""The same envd through e2b's AsyncSandbox. Where the async SDK speaks a
different wire dialect than the sync one it matters most: async watch_dir uses
the server-streaming WatchDir RPC (sync uses CreateWatcher/GetWatcherEvents),
and async handles consume Start/Connect streams concurrently with other calls."""

import asyncio
import re
import secrets
import time

import pytest

from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    FilesystemEventType,
    FileType,
    PtySize,
    TimeoutException,
)

from conftest import HOME, all_bytes


async def until(pred, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if asyncio.iscoroutine(v):
            v = await v
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what() if callable(what) else what}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def ascratch(async_sandbox: AsyncSandbox):
    path = f"{HOME}/compat-pyasync-{secrets.token_hex(4)}"
    yield path
    try:
        await async_sandbox.files.remove(path, user="root")
    except Exception:
        pass


async def test_async_run_and_callbacks(async_sandbox: AsyncSandbox):
    out, err = [], []
    r = await async_sandbox.commands.run(
        "echo out; echo err >&2; whoami", on_stdout=out.append, on_stderr=err.append
    )
    assert r.exit_code == 0
    assert r.stdout == "out\nuser\n"
    assert "".join(out) == "out\nuser\n"
    assert "".join(err) == "err\n"
    assert (await async_sandbox.commands.run("whoami", user="root")).stdout == "root\n"


async def test_async_background_streams_while_running(async_sandbox: AsyncSandbox, ascratch: str):
    flag = f"{ascratch}.flag"
    out = []
    h = await async_sandbox.commands.run(
        f"echo first; while [ ! -e {flag} ]; do sleep 0.05; done; echo second",
        background=True,
        on_stdout=out.append,
    )
    try:
        await until(lambda: "".join(out) == "first\n", "first chunk")
        assert h.exit_code is None
        await async_sandbox.commands.run(f"touch {flag}")
        r = await h.wait()
        assert r.stdout == "first\nsecond\n"
    finally:
        await async_sandbox.commands.kill(h.pid)
        await async_sandbox.commands.run(f"rm -f {flag}")


async def test_async_exit_error_and_timeout(async_sandbox: AsyncSandbox):
    with pytest.raises(CommandExitException) as ei:
        await async_sandbox.commands.run("echo o; echo e >&2; exit 5")
    assert (ei.value.exit_code, ei.value.stdout, ei.value.stderr) == (5, "o\n", "e\n")
    start = time.monotonic()
    with pytest.raises(TimeoutException):
        await async_sandbox.commands.run("sleep 20", timeout=1)
    assert time.monotonic() - start < 10


async def test_async_stdin(async_sandbox: AsyncSandbox):
    h = await async_sandbox.commands.run("cat", background=True, stdin=True)
    try:
        await async_sandbox.commands.send_stdin(h.pid, "async ")
        await h.send_stdin(b"stdin\n")
        await h.close_stdin()
        r = await h.wait()
        assert r.stdout == "async stdin\n"
    finally:
        await async_sandbox.commands.kill(h.pid)


async def test_async_connect_and_kill(async_sandbox: AsyncSandbox):
    h = await async_sandbox.commands.run("sleep 30", background=True)
    await h.disconnect()
    c = await async_sandbox.commands.connect(h.pid)
    assert c.pid == h.pid
    assert any(p.pid == h.pid for p in await async_sandbox.commands.list())
    assert await async_sandbox.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException):
        await c.wait()


async def test_async_files_roundtrip(async_sandbox: AsyncSandbox, ascratch: str):
    info = await async_sandbox.files.write(f"{ascratch}/a.bin", all_bytes())
    assert info.path == f"{ascratch}/a.bin"
    assert bytes(await async_sandbox.files.read(f"{ascratch}/a.bin", format="bytes")) == all_bytes()
    infos = await async_sandbox.files.write_files(
        [{"path": f"{ascratch}/m/1.txt", "data": "one"}, {"path": f"{ascratch}/m/2.txt", "data": "two"}]
    )
    assert len(infos) == 2
    entries = await async_sandbox.files.list(f"{ascratch}/m")
    assert [e.name for e in entries] == ["1.txt", "2.txt"]
    assert (await async_sandbox.files.get_info(f"{ascratch}/m")).type == FileType.DIR
    assert await async_sandbox.files.make_dir(f"{ascratch}/m") is False
    await async_sandbox.files.rename(f"{ascratch}/m/1.txt", f"{ascratch}/m/3.txt")
    assert await async_sandbox.files.exists(f"{ascratch}/m/1.txt") is False
    await async_sandbox.files.remove(f"{ascratch}/m")
    assert await async_sandbox.files.exists(f"{ascratch}/m") is False
    with pytest.raises(FileNotFoundException):
        await async_sandbox.files.read(f"{ascratch}/m/3.txt")


async def test_async_bad_user(async_sandbox: AsyncSandbox):
    with pytest.raises(AuthenticationException):
        await async_sandbox.commands.run("whoami", user="no-such-user-compat")
    with pytest.raises(AuthenticationException):
        await async_sandbox.files.read("/etc/hostname", user="no-such-user-compat")


class Events:
    def __init__(self):
        self.events = []

    def __call__(self, e):
        self.events.append(e)

    def has(self, type_, name):
        return any(e.type == type_ and e.name == name for e in self.events)

    def dump(self):
        return [f"{e.type.value}:{e.name}" for e in self.events]


async def test_async_watch_dir(async_sandbox: AsyncSandbox, ascratch: str):
    d = f"{ascratch}/flat"
    await async_sandbox.files.make_dir(d)
    ev = Events()
    h = await async_sandbox.files.watch_dir(d, ev)
    try:
        await async_sandbox.commands.run(f"echo x > {d}/f.txt")
        await until(lambda: ev.has(FilesystemEventType.WRITE, "f.txt"), lambda: f"WRITE f.txt in {ev.dump()}")
        await async_sandbox.files.write(f"{d}/g.txt", "x")
        await until(lambda: ev.has(FilesystemEventType.CREATE, "g.txt"), lambda: f"CREATE g.txt in {ev.dump()}")
        await async_sandbox.files.remove(f"{d}/g.txt")
        await until(lambda: ev.has(FilesystemEventType.REMOVE, "g.txt"), lambda: f"REMOVE g.txt in {ev.dump()}")
    finally:
        await h.stop()


async def test_async_watch_overwrite_with_files_write_emits_write(async_sandbox: AsyncSandbox, ascratch: str):
    # Upstream envd rewrites the file in place: the watcher sees WRITE <name>.
    await async_sandbox.files.write(f"{ascratch}/existing.txt", "first")
    ev = Events()
    h = await async_sandbox.files.watch_dir(ascratch, ev)
    try:
        await async_sandbox.files.write(f"{ascratch}/existing.txt", "second")
        await until(
            lambda: ev.has(FilesystemEventType.WRITE, "existing.txt"), lambda: f"WRITE existing.txt in {ev.dump()}"
        )
    finally:
        await h.stop()


async def test_async_watch_dir_recursive_and_new_subdir(async_sandbox: AsyncSandbox, ascratch: str):
    d = f"{ascratch}/rec"
    await async_sandbox.files.make_dir(f"{d}/nested")
    ev = Events()
    h = await async_sandbox.files.watch_dir(d, ev, recursive=True)
    try:
        await async_sandbox.files.write(f"{d}/nested/file.txt", "x")
        await until(
            lambda: any(e.name == "nested/file.txt" for e in ev.events), f"nested/file.txt in {ev.dump()}"
        )
        await async_sandbox.files.make_dir(f"{d}/later")
        await until(lambda: ev.has(FilesystemEventType.CREATE, "later"), lambda: f"CREATE later in {ev.dump()}")
        await async_sandbox.files.write(f"{d}/later/new.txt", "x")
        await until(lambda: any(e.name == "later/new.txt" for e in ev.events), lambda: f"later/new.txt in {ev.dump()}")
    finally:
        await h.stop()


async def test_async_watch_dir_include_entry(async_sandbox: AsyncSandbox, ascratch: str):
    await async_sandbox.files.make_dir(ascratch)
    ev = Events()
    h = await async_sandbox.files.watch_dir(ascratch, ev, include_entry=True)
    try:
        await async_sandbox.commands.run(f"echo second > {ascratch}/f.txt")
        await until(lambda: ev.has(FilesystemEventType.WRITE, "f.txt"), lambda: f"WRITE f.txt in {ev.dump()}")
        e = next(e for e in ev.events if e.type == FilesystemEventType.WRITE and e.name == "f.txt")
        assert e.entry is not None and e.entry.path == f"{ascratch}/f.txt"
    finally:
        await h.stop()


async def test_async_watch_missing_dir(async_sandbox: AsyncSandbox, ascratch: str):
    with pytest.raises(FileNotFoundException):
        await async_sandbox.files.watch_dir(f"{ascratch}/nope", lambda e: None)


async def test_async_pty(async_sandbox: AsyncSandbox):
    chunks = []
    t = await async_sandbox.pty.create(PtySize(rows=24, cols=80), on_data=lambda b: chunks.append(bytes(b)))
    out = lambda: b"".join(chunks).decode(errors="replace")  # noqa: E731
    try:
        await async_sandbox.pty.send_stdin(t.pid, b"echo hi\n")
        await until(lambda: re.search(r"(^|[\r\n])hi\r?\n", out()), lambda: f"'hi' in {out()!r}")
        await async_sandbox.pty.resize(t.pid, PtySize(rows=40, cols=120))
        await async_sandbox.pty.send_stdin(t.pid, b'echo "size-$(stty size | tr " " x)"\n')
        await until(lambda: "size-40x120" in out(), lambda: f"size-40x120 in {out()!r}")
        assert await async_sandbox.pty.kill(t.pid) is True
        with pytest.raises(CommandExitException):
            await t.wait()
    finally:
        await async_sandbox.pty.kill(t.pid)
