"""How envd's errors reach Python SDK users."""

import json
import urllib.error
import urllib.request

import pytest

from e2b import (
    AuthenticationException,
    FileNotFoundException,
    NotFoundException,
    PtySize,
    Sandbox,
)

from conftest import BAD_USER, ENVD_URL, envd_headers


def test_health(sandbox: Sandbox):
    # sandboxd mode: through the proxy, routing headers only (no access token).
    req = urllib.request.Request(f"{ENVD_URL}/health", headers=envd_headers(sandbox, token=False))
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 204
    assert sandbox.is_running() is True


def test_read_missing_file(sandbox: Sandbox, scratch: str):
    with pytest.raises(FileNotFoundException):
        sandbox.files.read(f"{scratch}/nope.txt")
    with pytest.raises(NotFoundException):
        sandbox.files.read(f"{scratch}/nope.txt")


def test_bad_user_command(sandbox: Sandbox):
    with pytest.raises(AuthenticationException):
        sandbox.commands.run("whoami", user=BAD_USER)


def test_bad_user_filesystem_rpc(sandbox: Sandbox):
    with pytest.raises(AuthenticationException):
        sandbox.files.list("/", user=BAD_USER)
    with pytest.raises(AuthenticationException):
        sandbox.files.make_dir("/tmp/compat-bad-user", user=BAD_USER)


def test_bad_user_files_http(sandbox: Sandbox):
    with pytest.raises(AuthenticationException):
        sandbox.files.read("/etc/hostname", user=BAD_USER)
    with pytest.raises(AuthenticationException):
        sandbox.files.write("/tmp/compat-bad-user.txt", "x", user=BAD_USER)


def test_bad_user_pty(sandbox: Sandbox):
    with pytest.raises(AuthenticationException):
        sandbox.pty.create(PtySize(rows=24, cols=80), user=BAD_USER)


def test_files_error_bodies_are_json(sandbox: Sandbox):
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(
            urllib.request.Request(f"{ENVD_URL}/files?path=/no/such/file", headers=envd_headers(sandbox)), timeout=10
        )
    assert ei.value.code == 404
    assert json.loads(ei.value.read())["code"] == 404
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(
            urllib.request.Request(
                f"{ENVD_URL}/files?path=/etc/hostname&username={BAD_USER}", headers=envd_headers(sandbox)
            ),
            timeout=10,
        )
    assert ei.value.code == 401
    assert json.loads(ei.value.read())["code"] == 401


def test_send_stdin_unknown_pid(sandbox: Sandbox):
    with pytest.raises(NotFoundException):
        sandbox.commands.send_stdin(999_999, "x")


def test_resize_and_kill_unknown_pid(sandbox: Sandbox):
    with pytest.raises(NotFoundException):
        sandbox.pty.resize(999_999, PtySize(rows=10, cols=10))
    assert sandbox.pty.kill(999_999) is False
