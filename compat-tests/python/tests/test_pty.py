"""sandbox.pty through the real e2b Python SDK (sync Sandbox)."""

import re
import threading

import pytest

from e2b import CommandExitException, PtySize, Sandbox

from conftest import process_gone, wait_for


class Term:
    """A PTY whose output is collected by a background thread."""

    def __init__(self, sandbox: Sandbox, **kwargs):
        self.sandbox = sandbox
        self.handle = sandbox.pty.create(kwargs.pop("size", PtySize(rows=24, cols=80)), **kwargs)
        self.chunks = []
        self.result = None
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.result = self.handle.wait(on_pty=lambda b: self.chunks.append(bytes(b)))
        except Exception as e:  # noqa: BLE001 - surfaced by the tests
            self.error = e

    @property
    def pid(self):
        return self.handle.pid

    def out(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def send(self, text: str):
        self.sandbox.pty.send_stdin(self.pid, text.encode())

    def join(self, timeout=15):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "pty did not end"

    def close(self):
        try:
            self.sandbox.pty.kill(self.pid)
        except Exception:
            pass


def test_pty_echo_hi(sandbox: Sandbox):
    t = Term(sandbox)
    try:
        assert t.pid > 0
        t.send("echo hi\n")
        wait_for(lambda: re.search(r"(^|[\r\n])hi\r?\n", t.out()), lambda: f"'hi' output in {t.out()!r}")
        t.send("echo $((40+2))\n")
        wait_for(lambda: "42" in t.out(), lambda: f"42 in {t.out()!r}")
    finally:
        t.close()


def test_pty_is_a_tty_with_login_bash(sandbox: Sandbox):
    t = Term(sandbox)
    try:
        t.send('[ -t 0 ] && echo "tty-$((6*7))"; echo "term-$TERM"; echo "who-$(whoami)"; exit 0\n')
        t.join()
        assert t.error is None, t.error
        assert t.result.exit_code == 0
        assert "tty-42" in t.out()
        assert "term-xterm-256color" in t.out()
        assert "who-user" in t.out()
    finally:
        t.close()


def test_pty_bulk_output(sandbox: Sandbox):
    t = Term(sandbox)
    try:
        t.send("seq 1 50000; exit\n")
        t.join()
        assert t.error is None, t.error
        plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r", "", t.out())
        nums = [l for l in plain.split("\n") if l.isdigit()]
        assert nums == [str(i) for i in range(1, 50_001)]
    finally:
        t.close()


def test_pty_root_cwd_envs(sandbox: Sandbox):
    t = Term(sandbox, user="root", cwd="/tmp", envs={"PTY_MARK": "marked"})
    try:
        t.send('echo "u-$(whoami) d-$(pwd) m-$PTY_MARK"; exit\n')
        t.join()
        assert "u-root d-/tmp m-marked" in t.out()
    finally:
        t.close()


def test_pty_resize(sandbox: Sandbox):
    t = Term(sandbox, size=PtySize(rows=24, cols=80))
    try:
        t.send('echo "size-$(stty size | tr " " x)"\n')
        wait_for(lambda: "size-24x80" in t.out(), lambda: f"size-24x80 in {t.out()!r}")
        sandbox.pty.resize(t.pid, PtySize(rows=30, cols=100))
        t.send('echo "size-$(stty size | tr " " x)"\n')
        wait_for(lambda: "size-30x100" in t.out(), lambda: f"size-30x100 in {t.out()!r}")
    finally:
        t.close()


def test_pty_kill(sandbox: Sandbox):
    t = Term(sandbox)
    assert sandbox.pty.kill(t.pid) is True
    t.join()
    assert isinstance(t.error, CommandExitException), repr(t.error)
    assert t.error.exit_code != 0
    wait_for(lambda: process_gone(sandbox, t.pid), f"pty pid {t.pid} to be gone", 5)
    assert sandbox.pty.kill(999_999) is False
