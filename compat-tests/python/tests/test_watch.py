"""Sync watch_dir through the real e2b Python SDK: the polling RPCs
filesystem.Filesystem CreateWatcher / GetWatcherEvents / RemoveWatcher."""

import time

import pytest

from e2b import (
    FileNotFoundException,
    FilesystemEventType,
    FileType,
    InvalidArgumentException,
    Sandbox,
    SandboxException,
)


class Recorder:
    """Accumulates events from repeated get_new_events() calls."""

    def __init__(self, handle):
        self.handle = handle
        self.events = []

    def poll(self):
        self.events.extend(self.handle.get_new_events())

    def has(self, type_, name):
        return any(e.type == type_ and e.name == name for e in self.events)

    def wait(self, pred, what, timeout=10.0):
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if pred():
                return
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}; events: {self.dump()}")
            time.sleep(0.1)

    def wait_event(self, type_, name, timeout=10.0):
        self.wait(lambda: self.has(type_, name), f"{type_.value} {name}", timeout)

    def dump(self):
        return [f"{e.type.value}:{e.name}" for e in self.events]


def test_watch_overwrite_with_files_write_emits_write(sandbox: Sandbox, scratch: str):
    # What E2B's own watch tests rely on: upstream envd truncates and rewrites
    # the file in place, so the watcher sees WRITE <name>.
    sandbox.files.write(f"{scratch}/existing.txt", "first")
    w = Recorder(sandbox.files.watch_dir(scratch))
    try:
        sandbox.files.write(f"{scratch}/existing.txt", "second")
        w.wait_event(FilesystemEventType.WRITE, "existing.txt")
        assert all(e.name == "existing.txt" for e in w.events), w.dump()
    finally:
        w.handle.stop()


def test_watch_create_write_rename_chmod_remove(sandbox: Sandbox, scratch: str):
    d = f"{scratch}/flat"
    sandbox.files.make_dir(d)
    w = Recorder(sandbox.files.watch_dir(d))
    try:
        sandbox.files.write(f"{d}/new.txt", "x")
        w.wait_event(FilesystemEventType.CREATE, "new.txt")
        sandbox.commands.run(f"echo more >> {d}/new.txt")
        w.wait_event(FilesystemEventType.WRITE, "new.txt")
        sandbox.files.rename(f"{d}/new.txt", f"{d}/renamed.txt")
        w.wait_event(FilesystemEventType.RENAME, "new.txt")
        w.wait_event(FilesystemEventType.CREATE, "renamed.txt")
        sandbox.commands.run(f"chmod 600 {d}/renamed.txt")
        w.wait_event(FilesystemEventType.CHMOD, "renamed.txt")
        sandbox.files.remove(f"{d}/renamed.txt")
        w.wait_event(FilesystemEventType.REMOVE, "renamed.txt")
    finally:
        w.handle.stop()


def test_watch_events_are_not_repeated(sandbox: Sandbox, scratch: str):
    sandbox.files.make_dir(scratch)
    h = sandbox.files.watch_dir(scratch)
    try:
        sandbox.files.write(f"{scratch}/once.txt", "x")
        w = Recorder(h)
        w.wait_event(FilesystemEventType.CREATE, "once.txt")
        time.sleep(0.3)
        again = h.get_new_events()
        assert not any(e.type == FilesystemEventType.CREATE and e.name == "once.txt" for e in again), again
    finally:
        h.stop()


def test_watch_non_recursive_ignores_subdirs(sandbox: Sandbox, scratch: str):
    d = f"{scratch}/nonrec"
    sandbox.files.make_dir(f"{d}/sub")
    w = Recorder(sandbox.files.watch_dir(d))
    try:
        sandbox.files.write(f"{d}/sub/inner.txt", "x")
        sandbox.files.write(f"{d}/top.txt", "x")
        w.wait_event(FilesystemEventType.CREATE, "top.txt")
        time.sleep(0.3)
        w.poll()
        assert not any("/" in e.name for e in w.events), w.dump()
    finally:
        w.handle.stop()


def test_watch_recursive_existing_nested(sandbox: Sandbox, scratch: str):
    d = f"{scratch}/rec"
    sandbox.files.make_dir(f"{d}/nested/deeper")
    w = Recorder(sandbox.files.watch_dir(d, recursive=True))
    try:
        sandbox.files.write(f"{d}/nested/file.txt", "first")
        w.wait_event(FilesystemEventType.CREATE, "nested/file.txt")
        sandbox.commands.run(f"echo more >> {d}/nested/file.txt; : > {d}/nested/deeper/x")
        w.wait_event(FilesystemEventType.WRITE, "nested/file.txt")
        w.wait_event(FilesystemEventType.CREATE, "nested/deeper/x")
    finally:
        w.handle.stop()


def test_watch_recursive_dir_created_after_watch(sandbox: Sandbox, scratch: str):
    d = f"{scratch}/recadd"
    sandbox.files.make_dir(d)
    w = Recorder(sandbox.files.watch_dir(d, recursive=True))
    try:
        sandbox.files.make_dir(f"{d}/later")
        w.wait_event(FilesystemEventType.CREATE, "later")
        sandbox.files.write(f"{d}/later/file.txt", "content")
        w.wait(
            lambda: w.has(FilesystemEventType.WRITE, "later/file.txt")
            or w.has(FilesystemEventType.CREATE, "later/file.txt"),
            "an event for later/file.txt",
        )
        sandbox.files.make_dir(f"{d}/later/deeper")
        w.wait_event(FilesystemEventType.CREATE, "later/deeper")
        sandbox.files.write(f"{d}/later/deeper/f.txt", "x")
        w.wait(lambda: any(e.name == "later/deeper/f.txt" for e in w.events), "an event for later/deeper/f.txt")
    finally:
        w.handle.stop()


def test_watch_include_entry(sandbox: Sandbox, scratch: str):
    sandbox.files.make_dir(scratch)
    w = Recorder(sandbox.files.watch_dir(scratch, include_entry=True))
    try:
        sandbox.commands.run(f"echo second > {scratch}/f.txt")
        w.wait_event(FilesystemEventType.WRITE, "f.txt")
        ev = next(e for e in w.events if e.type == FilesystemEventType.WRITE and e.name == "f.txt")
        assert ev.entry is not None
        assert ev.entry.name == "f.txt"
        assert ev.entry.path == f"{scratch}/f.txt"
        assert ev.entry.type == FileType.FILE
    finally:
        w.handle.stop()


def test_watch_stop_then_poll_fails(sandbox: Sandbox, scratch: str):
    sandbox.files.make_dir(scratch)
    h = sandbox.files.watch_dir(scratch)
    h.stop()
    with pytest.raises(SandboxException):
        h.get_new_events()


def test_watch_missing_dir(sandbox: Sandbox, scratch: str):
    with pytest.raises(FileNotFoundException):
        sandbox.files.watch_dir(f"{scratch}/no-such-dir")


def test_watch_file_is_an_error(sandbox: Sandbox, scratch: str):
    sandbox.files.write(f"{scratch}/a-file.txt", "x")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.watch_dir(f"{scratch}/a-file.txt")
