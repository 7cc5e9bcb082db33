"""A "secure" sandbox: envd initialised by POST /init with an access token and
sandbox-wide envs, as sandboxd's control plane does. This module starts its
own envd on 127.0.0.1:49986 (the token would lock the shared one) and builds
the SDK's Sandbox the way Sandbox.create() does after the control plane
answered: X-Access-Token in the sandbox headers, envd version 0.6.13, the
envd URL via sandbox_url. The constructor is internal API; if a future SDK
changes it, fix _secure()."""

import json
import os
import secrets
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from packaging.version import Version

from e2b import AuthenticationException, ConnectionConfig, Sandbox

from conftest import DEBUG_ONLY_REASON, HOME, SANDBOXD

# In sandboxd mode test_lifecycle.py covers the secure sandbox sandboxd creates.
pytestmark = pytest.mark.skipif(SANDBOXD, reason=DEBUG_ONLY_REASON)

PORT = int(os.environ.get("COMPAT_SECURE_PY_PORT", "49986"))
URL = f"http://127.0.0.1:{PORT}"
TOKEN = "compat-py-token-" + secrets.token_hex(8)
ENVD = os.environ.get("COMPAT_ENVD") or str(Path(__file__).resolve().parents[3] / "bin" / "envd")


def _secure(token: str = TOKEN) -> Sandbox:
    config = ConnectionConfig(
        sandbox_url=URL,
        debug=True,
        extra_sandbox_headers={
            "X-Access-Token": token,
            "E2b-Sandbox-Id": "secure_sandbox_id",
            "E2b-Sandbox-Port": "49983",
        },
    )
    return Sandbox(
        sandbox_id="secure_sandbox_id",
        sandbox_domain=None,
        envd_version=Version("0.6.13"),
        envd_access_token=token,
        traffic_access_token=None,
        connection_config=config,
    )


def _status(url: str, **kw):
    """HTTP status of a request, or None when nothing answers."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, **kw), timeout=10) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except urllib.error.URLError:
        return None


@pytest.fixture(scope="module")
def secure():
    log_dir = os.environ.get("COMPAT_LOG_DIR")
    log = open(f"{log_dir}/envd-secure-py.log", "ab") if log_dir else subprocess.DEVNULL
    proc = subprocess.Popen([ENVD, "--listen", f"127.0.0.1:{PORT}", "--log-level", "debug"], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 10
        while _status(f"{URL}/health") != 204:
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"second envd on :{PORT} did not start")
            time.sleep(0.1)
        body = json.dumps({"accessToken": TOKEN, "envVars": {"SANDBOX_WIDE": "from-init"}}).encode()
        assert _status(f"{URL}/init", data=body, method="POST", headers={"Content-Type": "application/json"}) == 204
        yield _secure()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_secure_sdk_with_token(secure: Sandbox):
    assert secure.commands.run("whoami").stdout == "user\n"
    path = f"{HOME}/compat-py-secure-{secrets.token_hex(4)}.txt"
    try:
        secure.files.write(path, "secret")
        assert secure.files.read(path) == "secret"
        assert secure.files.exists(path)
    finally:
        secure.files.remove(path)


def test_secure_wrong_token(secure: Sandbox):
    bad = _secure("not-the-token")
    with pytest.raises(AuthenticationException):
        bad.commands.run("true")
    with pytest.raises(AuthenticationException):
        bad.files.read("/etc/hostname")


def test_secure_signed_urls(secure: Sandbox):
    path = f"{HOME}/compat-py-signed-{secrets.token_hex(4)}.txt"
    try:
        up = secure.upload_url(path)
        assert "signature=v1_" in up
        boundary = "compat" + secrets.token_hex(8)
        body = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="x.txt"\r\n\r\n'
            f"via signed url\r\n--{boundary}--\r\n"
        ).encode()
        req = urllib.request.Request(
            up, data=body, method="POST", headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read())[0]["path"] == path
        with urllib.request.urlopen(secure.download_url(path), timeout=10) as r:
            assert r.read() == b"via signed url"
        with urllib.request.urlopen(secure.download_url(path, user="root", use_signature_expiration=60), timeout=10) as r:
            assert r.read() == b"via signed url"
        assert _status(f"{URL}/files?path={path}") == 401
    finally:
        secure.files.remove(path)


def test_secure_init_envs(secure: Sandbox):
    assert secure.commands.run("echo $SANDBOX_WIDE").stdout == "from-init\n"
    assert secure.commands.run("echo $SANDBOX_WIDE", envs={"SANDBOX_WIDE": "cmd"}).stdout == "cmd\n"
