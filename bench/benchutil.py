"""What the bench scripts that drive E2B's Python SDKs share: they run
against sandboxd on loopback only (no debug mode, no domain, no access token
from the caller's environment), and time in milliseconds."""

import os
import time

for var in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN"):
    os.environ.pop(var, None)
assert os.environ["E2B_API_URL"].startswith("http://127.0.0.1:")
assert os.environ["E2B_SANDBOX_URL"].startswith("http://127.0.0.1:")


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000
