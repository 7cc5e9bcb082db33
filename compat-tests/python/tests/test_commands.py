"""sandbox.commands through the real e2b Python SDK (sync Sandbox):
process.Process Start/Connect/List/SendInput/CloseStdin/SendSignal."""

import threading
import time

import pytest

from e2b import (
    CommandExitException,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxException,
    TimeoutException,
)

from conftest import HOME, process_gone, wait_for


def test_run_echo(sandbox: Sandbox):
    r = sandbox.commands.run('echo "Hello, World!"')
    assert r.exit_code == 0
    assert r.stdout == "Hello, World!\n"
    assert r.stderr == ""
    assert r.error in (None, "")


def test_run_special_characters_and_unicode(sandbox: Sandbox):
    r = sandbox.commands.run("printf '%s\\n' '!@#$%^&*()_+' 'line two' 'žluťoučký kůň 🐎'")
    assert r.stdout == "!@#$%^&*()_+\nline two\nžluťoučký kůň 🐎\n"


def test_run_callbacks_receive_stdout_and_stderr(sandbox: Sandbox):
    out, err = [], []
    r = sandbox.commands.run(
        "for i in 1 2 3; do echo out$i; echo err$i >&2; done",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    assert "".join(out) == "out1\nout2\nout3\n"
    assert "".join(err) == "err1\nerr2\nerr3\n"
    assert r.stdout == "".join(out)
    assert r.stderr == "".join(err)


def test_run_output_streams_before_exit(sandbox: Sandbox, scratch: str):
    flag = f"{scratch}.flag"
    out, err = [], []
    seen_at = {}

    def release():
        # Runs concurrently with the streaming run() below: the command only
        # finishes once this thread saw its first output and created the flag.
        wait_for(lambda: "".join(out) == "first\n" and "".join(err) == "first-err\n", "first chunk")
        seen_at["t"] = time.monotonic()
        sandbox.commands.run(f"touch {flag}")

    t = threading.Thread(target=release, daemon=True)
    t.start()
    try:
        r = sandbox.commands.run(
            f"echo first; echo first-err >&2; while [ ! -e {flag} ]; do sleep 0.05; done; echo second",
            on_stdout=out.append,
            on_stderr=err.append,
            timeout=20,
        )
    finally:
        t.join(timeout=15)
        sandbox.commands.run(f"rm -f {flag}")
    assert "t" in seen_at, "output was not streamed before the command exited"
    assert r.stdout == "first\nsecond\n"


def test_nonzero_exit_raises_command_exit_exception(sandbox: Sandbox):
    with pytest.raises(CommandExitException) as ei:
        sandbox.commands.run("echo to-out; echo to-err >&2; exit 3")
    e = ei.value
    assert isinstance(e, SandboxException)
    assert e.exit_code == 3
    assert e.error == "exit status 3"  # Go's ProcessState text, as upstream envd
    assert e.stdout == "to-out\n"
    assert e.stderr == "to-err\n"


def test_envs(sandbox: Sandbox):
    r = sandbox.commands.run('echo "$FOO|$BAR"', envs={"FOO": "bar", "BAR": "with spaces =x"})
    assert r.stdout == "bar|with spaces =x\n"
    assert sandbox.commands.run('echo "[$FOO]"').stdout == "[]\n"


def test_default_environment(sandbox: Sandbox):
    r = sandbox.commands.run('echo "$HOME|$USER|$LOGNAME"; command -v ls >/dev/null && echo path-ok')
    assert r.stdout == f"{HOME}|user|user\npath-ok\n"


def test_cwd(sandbox: Sandbox):
    assert sandbox.commands.run("pwd").stdout == f"{HOME}\n"
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"


def test_relative_cwd(sandbox: Sandbox, scratch: str):
    rel = scratch[len(HOME) + 1 :]
    sandbox.commands.run(f"mkdir -p {scratch}")
    assert sandbox.commands.run("pwd", cwd=rel).stdout == f"{scratch}\n"
    assert sandbox.commands.run("pwd", cwd=f"~/{rel}").stdout == f"{scratch}\n"


def test_missing_cwd_is_invalid_argument(sandbox: Sandbox):
    with pytest.raises(InvalidArgumentException):
        sandbox.commands.run("pwd", cwd="/definitely/not/here")


def test_users_whoami(sandbox: Sandbox):
    assert sandbox.commands.run("whoami").stdout == "user\n"
    assert sandbox.commands.run("whoami", user="user").stdout == "user\n"
    assert sandbox.commands.run("whoami", user="root").stdout == "root\n"
    assert sandbox.commands.run("echo $HOME; pwd", user="root").stdout == "/root\n/root\n"
    assert sandbox.commands.run("id -u", user="root").stdout == "0\n"


def test_two_mib_of_output_intact(sandbox: Sandbox):
    expected = "".join(f"{i}\n" for i in range(1, 320_001))
    assert len(expected) > 2 * 1024 * 1024
    chunks = []
    r = sandbox.commands.run("seq 1 320000", on_stdout=chunks.append)
    assert len(r.stdout) == len(expected)
    assert r.stdout == expected
    assert "".join(chunks) == expected


def test_two_mib_of_multibyte_output_intact(sandbox: Sandbox):
    r = sandbox.commands.run(
        "yes '€€€€€€€€€€' | head -n 70000 | tr -d '\\n'; yes 'řřřřřřřřřř' | head -n 30000 | tr -d '\\n' >&2"
    )
    assert r.stdout == "€" * 700_000
    assert r.stderr == "ř" * 300_000


def test_timeout_raises_and_kills(sandbox: Sandbox):
    start = time.monotonic()
    h = sandbox.commands.run("sleep 20; echo not-reached", background=True, timeout=1)
    with pytest.raises(TimeoutException):
        h.wait()
    assert time.monotonic() - start < 10
    # envd bounds the process lifetime by the deadline (Connect-Timeout-Ms).
    wait_for(lambda: process_gone(sandbox, h.pid), f"pid {h.pid} to be killed after its deadline", 5)


def test_foreground_timeout(sandbox: Sandbox):
    start = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 20", timeout=1)
    assert time.monotonic() - start < 10


def test_stdin_send_and_close(sandbox: Sandbox):
    h = sandbox.commands.run("cat", background=True, stdin=True)
    try:
        sandbox.commands.send_stdin(h.pid, "hello ")
        h.send_stdin("world\n")
        sandbox.commands.send_stdin(h.pid, "bytes ✓\n".encode())
        sandbox.commands.close_stdin(h.pid)
        r = h.wait()
        assert r.exit_code == 0
        assert r.stdout == "hello world\nbytes ✓\n"
    finally:
        sandbox.commands.kill(h.pid)


def test_stdin_binary_and_handle_close(sandbox: Sandbox):
    h = sandbox.commands.run('od -An -v -tx1 | tr -s " \\n" " "', background=True, stdin=True)
    try:
        h.send_stdin(bytes([0, 1, 127, 128, 200, 255, 10]))
        h.close_stdin()
        assert h.wait().stdout.strip() == "00 01 7f 80 c8 ff 0a"
    finally:
        sandbox.commands.kill(h.pid)


def test_stdin_closed_by_default(sandbox: Sandbox):
    assert sandbox.commands.run("cat; echo eof-seen", timeout=5).stdout == "eof-seen\n"


def test_background_and_connect(sandbox: Sandbox, scratch: str):
    flag = f"{scratch}.flag"
    h = sandbox.commands.run(
        f"echo before; while [ ! -e {flag} ]; do sleep 0.05; done; echo after", background=True
    )
    try:
        assert h.pid > 0
        h.disconnect()
        c = sandbox.commands.connect(h.pid)
        assert c.pid == h.pid
        sandbox.commands.run(f"touch {flag}")
        out = []
        r = c.wait(on_stdout=out.append)
        assert r.exit_code == 0
        assert r.stdout.endswith("after\n")
        assert "".join(out).endswith("after\n")
    finally:
        sandbox.commands.kill(h.pid)
        sandbox.commands.run(f"rm -f {flag}")


def test_connect_after_exit_replays_end(sandbox: Sandbox):
    h = sandbox.commands.run("echo done; exit 4", background=True)
    with pytest.raises(CommandExitException):
        h.wait()
    c = sandbox.commands.connect(h.pid)
    assert c.pid == h.pid
    with pytest.raises(CommandExitException) as ei:
        c.wait()
    assert ei.value.exit_code == 4


def test_connect_unknown_pid(sandbox: Sandbox):
    with pytest.raises(NotFoundException):
        sandbox.commands.connect(999_999)


def test_kill(sandbox: Sandbox):
    h = sandbox.commands.run("sleep 30", background=True)
    assert sandbox.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    # Upstream envd: exit_code -1 and Go's ProcessState text for signal deaths.
    assert ei.value.exit_code == -1
    assert ei.value.error == "signal: killed"
    wait_for(lambda: process_gone(sandbox, h.pid), f"pid {h.pid} to be gone", 5)
    assert all(p.pid != h.pid for p in sandbox.commands.list())
    assert sandbox.commands.kill(999_999) is False


def test_handle_kill(sandbox: Sandbox):
    h = sandbox.commands.run("sleep 30", background=True)
    assert h.kill() is True
    with pytest.raises(CommandExitException):
        h.wait()


def test_list(sandbox: Sandbox):
    h1 = sandbox.commands.run("sleep 30", background=True, envs={"LIST_MARK": "yes"}, cwd="/tmp")
    h2 = sandbox.commands.run("sleep 31", background=True)
    try:
        procs = {p.pid: p for p in sandbox.commands.list()}
        assert h1.pid in procs and h2.pid in procs, procs
        p1 = procs[h1.pid]
        assert p1.cmd == "/bin/bash"
        assert list(p1.args) == ["-l", "-c", "sleep 30"]
        assert p1.envs.get("LIST_MARK") == "yes"
        assert p1.cwd == "/tmp"
        assert list(procs[h2.pid].args) == ["-l", "-c", "sleep 31"]
    finally:
        sandbox.commands.kill(h1.pid)
        sandbox.commands.kill(h2.pid)
