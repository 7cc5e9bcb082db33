"""SDK-observed timings with E2B's Python SDK against sandboxd.

Driven by `go run ./bench -scenario sdk`, which sets E2B_API_URL,
E2B_SANDBOX_URL and E2B_API_KEY to its own sandboxd on loopback. Prints one
JSON object per line:

  {"kind": "iter", "warmup": bool, "create_ms": .., "first_run_ms": ..,
   "runs_ms": [..], "direct_runs_ms": [..], "kill_ms": ..}
  {"kind": "error", "error": "..."}

usage: sdk_bench.py ITERATIONS RUNS_PER_SANDBOX [DIRECT_ENVD_URL]
"""

import json
import sys
import time

from benchutil import ms  # noqa: E402  (first: it checks the environment)

from e2b import Sandbox  # noqa: E402


def main() -> None:
    iterations, runs = int(sys.argv[1]), int(sys.argv[2])
    direct = sys.argv[3] if len(sys.argv) > 3 else ""
    for i in range(iterations + 1):  # the first one warms imports and pools
        out = {"kind": "iter", "warmup": i == 0}
        sbx = None
        try:
            t0 = time.perf_counter()
            sbx = Sandbox.create(timeout=600)
            out["create_ms"] = ms(t0)
            t0 = time.perf_counter()
            sbx.commands.run("true")
            out["first_run_ms"] = ms(t0)
            out["runs_ms"] = []
            for _ in range(runs):
                t0 = time.perf_counter()
                sbx.commands.run("true")
                out["runs_ms"].append(ms(t0))
            if direct:
                # The same SDK, its envd calls sent straight to a standalone
                # envd on loopback TCP instead of through sandboxd's proxy.
                d = Sandbox.connect(sbx.sandbox_id, sandbox_url=direct)
                out["direct_runs_ms"] = []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    d.commands.run("true")
                    out["direct_runs_ms"].append(ms(t0))
            t0 = time.perf_counter()
            sbx.kill()
            out["kill_ms"] = ms(t0)
            sbx = None
        except Exception as e:  # report and go on: the Go side counts errors
            out = {"kind": "error", "error": f"{type(e).__name__}: {e}"}
            if sbx is not None:
                try:
                    sbx.kill()
                except Exception:
                    pass
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
