"""Shared fixtures for the Python compat suite.

The real `e2b` SDK runs in debug mode: `Sandbox.create()` / `AsyncSandbox.create()`
make no API call and talk to envd at http://localhost:49983 with sandbox id
`debug_sandbox_id`; `kill()` is a no-op. E2B_DEBUG is forced so a stray
environment can never point these tests at a remote service.
"""

import os
import secrets
import time

os.environ["E2B_DEBUG"] = "true"
os.environ.setdefault("E2B_API_KEY", "e2b_" + "0" * 40)

import pytest  # noqa: E402

from e2b import AsyncSandbox, Sandbox  # noqa: E402

HOME = "/home/user"
ENVD_URL = os.environ.get("E2B_SANDBOX_URL") or "http://localhost:49983"
BAD_USER = "no-such-user-compat"


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


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    sbx = Sandbox.create()
    assert sbx.sandbox_id == "debug_sandbox_id", "SDK is not in debug mode"
    return sbx


@pytest.fixture
async def async_sandbox() -> AsyncSandbox:
    sbx = await AsyncSandbox.create()
    assert sbx.sandbox_id == "debug_sandbox_id", "SDK is not in debug mode"
    return sbx


@pytest.fixture
def scratch(sandbox: Sandbox):
    """A fresh absolute path under the default user's home, removed afterwards."""
    path = f"{HOME}/compat-py-{secrets.token_hex(4)}"
    yield path
    try:
        sandbox.files.remove(path, user="root")
    except Exception:
        pass
