"""Shared fixtures for the Python compat suite. Two targets (COMPAT_TARGET):

- `debug` (default): the real `e2b` SDK in debug mode. `Sandbox.create()` /
  `AsyncSandbox.create()` make no API call and talk to envd at
  http://localhost:49983 with sandbox id `debug_sandbox_id`; `kill()` is a
  no-op. E2B_DEBUG is forced so a stray environment can never point these
  tests at a remote service.
- `sandboxd`: the SDK against a real sandboxd (control plane + local backend)
  through E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY, without debug mode.
  Both URLs must be loopback. The fixtures' sandboxes are killed in teardown.
  With COMPAT_ADDRESSING=domain (run.sh's domain mode) only E2B_DOMAIN and
  E2B_API_KEY are set, as the SDKs' next major version will have it: the API
  at https://api.<domain>, each sandbox port at https://<port>-<id>.<domain>
  (a *.localhost name, so loopback).
"""

import os
import secrets
import time
from urllib.parse import urlsplit

TARGET = os.environ.get("COMPAT_TARGET") or "debug"
SANDBOXD = TARGET == "sandboxd"
# sandboxd's backend in sandboxd mode (run.sh's incus mode sets "incus").
BACKEND = os.environ.get("COMPAT_BACKEND") or "local"
# run.sh's cluster mode: volumes answer 501 on a remote Incus (incus/README.md).
NO_VOLUMES = bool(os.environ.get("COMPAT_NO_VOLUMES"))
if TARGET not in ("debug", "sandboxd"):
    raise RuntimeError(f"COMPAT_TARGET={TARGET}: want debug or sandboxd")
# run.sh's domain mode: E2B_DOMAIN only, TLS, host routing.
DOMAIN_MODE = SANDBOXD and os.environ.get("COMPAT_ADDRESSING") == "domain"
if DOMAIN_MODE:
    os.environ.pop("E2B_DEBUG", None)
    for _v in ("E2B_DOMAIN", "E2B_API_KEY"):
        if not os.environ.get(_v):
            raise RuntimeError(f"COMPAT_ADDRESSING=domain needs {_v}")
    for _v in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL"):
        if os.environ.get(_v):
            raise RuntimeError(f"COMPAT_ADDRESSING=domain: {_v} must not be set")
    # nss-myhostname resolves every *.localhost name to loopback.
    if not (urlsplit("https://" + os.environ["E2B_DOMAIN"]).hostname or "").endswith(".localhost"):
        raise RuntimeError(f"E2B_DOMAIN={os.environ['E2B_DOMAIN']} is not a *.localhost domain")
elif SANDBOXD:
    os.environ.pop("E2B_DEBUG", None)
    for _v in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"):
        if not os.environ.get(_v):
            raise RuntimeError(f"COMPAT_TARGET=sandboxd needs {_v}")
    for _v in ("E2B_API_URL", "E2B_SANDBOX_URL"):
        if urlsplit(os.environ[_v]).hostname not in ("127.0.0.1", "localhost", "::1"):
            raise RuntimeError(f"{_v}={os.environ[_v]} is not a loopback URL")
else:
    os.environ["E2B_DEBUG"] = "true"
    os.environ.setdefault("E2B_API_KEY", "e2b_" + "0" * 40)

import pytest  # noqa: E402

from e2b import AsyncSandbox, Sandbox  # noqa: E402

HOME = "/home/user"
# The E2B API as the SDK reaches it.
API_URL = f"https://api.{os.environ['E2B_DOMAIN']}" if DOMAIN_MODE else os.environ.get("E2B_API_URL", "")
# Where raw clients send envd requests, with envd_headers(sbx) for the route:
# E2B_SANDBOX_URL, or in domain mode the API host (sandboxd routes by those
# headers on any host, as by `<port>-<id>.<domain>`).
ENVD_URL = API_URL if DOMAIN_MODE else os.environ.get("E2B_SANDBOX_URL") or "http://localhost:49983"
BAD_USER = "no-such-user-compat"
SANDBOXD_ONLY = pytest.mark.skipif(not SANDBOXD, reason="sandboxd mode only (COMPAT_TARGET=sandboxd)")
DEBUG_ONLY_REASON = "debug mode only: builds a Sandbox with internal constructors against its own envd"


def envd_headers(sbx, token: bool = True) -> dict:
    """Headers a raw HTTP client needs to reach sbx's envd: none in debug mode;
    through sandboxd's proxy the routing headers the SDK sends and, unless
    token is False, the envd access token."""
    if not SANDBOXD:
        return {}
    h = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
    if token and sbx._envd_access_token:
        h["X-Access-Token"] = sbx._envd_access_token
    return h


def all_bytes() -> bytes:
    """Every byte value, four times over."""
    return bytes(range(256)) * 4


def wait_for(pred, what, timeout: float = 10.0, interval: float = 0.05):
    """Polls pred() until it returns something truthy; fails after timeout.

    what is a string, or a callable evaluated at failure time (current state)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what() if callable(what) else what}")
        time.sleep(interval)


def process_gone(sbx: Sandbox, pid: int) -> bool:
    r = sbx.commands.run(f"kill -0 {pid} 2>/dev/null && echo alive || echo gone", user="root")
    return r.stdout.strip() == "gone"


# The code interpreter's server and Jupyter log inside the sandbox
# (/tmp/code-interpreter.log, /tmp/jupyter.log), which dies with it: a failed
# test that used the code-interpreter sandbox (the `ci` fixture) gets their
# last lines in its report. A rare lost result (a JS/TS env var read as
# nothing) was undiagnosable without them.
CI_LOGS = ("/tmp/code-interpreter.log", "/tmp/jupyter.log")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    sbx = getattr(item, "funcargs", {}).get("ci")
    if rep.when != "call" or not rep.failed or sbx is None:
        return
    for path in CI_LOGS:
        try:
            text = sbx.files.read(path, user="root")
        except Exception as e:  # the report must not fail for want of a log
            text = f"(unreadable: {e})"
        rep.sections.append((f"{path} of {sbx.sandbox_id}, last 200 lines", "\n".join(text.splitlines()[-200:])))


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    if not SANDBOXD:
        sbx = Sandbox.create()
        assert sbx.sandbox_id == "debug_sandbox_id", "SDK is not in debug mode"
        yield sbx
        return
    sbx = Sandbox.create(timeout=900)
    assert sbx.sandbox_id != "debug_sandbox_id", "SDK is in debug mode"
    yield sbx
    sbx.kill()


@pytest.fixture
async def async_sandbox() -> AsyncSandbox:
    if not SANDBOXD:
        sbx = await AsyncSandbox.create()
        assert sbx.sandbox_id == "debug_sandbox_id", "SDK is not in debug mode"
        yield sbx
        return
    sbx = await AsyncSandbox.create(timeout=120)
    yield sbx
    await sbx.kill()


@pytest.fixture
def scratch(sandbox: Sandbox):
    """A fresh absolute path under the default user's home, removed afterwards."""
    path = f"{HOME}/compat-py-{secrets.token_hex(4)}"
    yield path
    try:
        sandbox.files.remove(path, user="root")
    except Exception:
        pass
