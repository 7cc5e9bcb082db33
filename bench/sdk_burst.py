"""N concurrent Sandbox.create() → commands.run('true') → kill() with E2B's
Python SDK, as one tenant's agent fleet would start them.

Then, with THEN > 0, THEN more of them one after another, as issue 24's
agent loop does right after a burst.

With BURST_CREATES_FIRST=1 in the environment, the burst's clients run
their commands and kills only once every create of the burst has returned,
so that a create shares the client's CPU with the other creates alone
(issue 24's "100 concurrent SDK creates"); the line
  {"kind": "created", "ms": .., "cpu_s": ..}
then says when the last create returned and the CPU the process had used.

Driven by the bench's incus-burst and spare scenarios, which set
E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY. Prints one JSON object per
line:

  {"kind": "item", "create_ms": .., "first_run_ms": .., "total_ms": ..}
  {"kind": "error", "error": "..."}
  {"kind": "wall", "ms": ..}   (from the start to the end of the last run)
  {"kind": "seq", "total_ms": ..}   (one of the THEN sequential ones)

usage: sdk_burst.py N [THEN]
"""

import json
import os
import sys
import threading
import time

from benchutil import ms  # noqa: E402  (first: it checks the environment)

from e2b import Sandbox  # noqa: E402


T0 = [0.0]  # when the burst starts (perf_counter)


CREATED: dict = {}  # set by the barrier of BURST_CREATES_FIRST


def one(out: list, lock: threading.Lock, start: threading.Event, created: threading.Barrier | None = None) -> None:
    start.wait()
    rec = {"kind": "item"}
    sbx = None
    try:
        t0 = time.perf_counter()
        try:
            sbx = Sandbox.create(timeout=600)
            rec["create_ms"] = ms(t0)
        finally:
            if created is not None:
                created.wait()
        t1 = time.perf_counter()
        sbx.commands.run("true")
        rec["first_run_ms"] = ms(t1)
        rec["total_ms"] = ms(t0)
        rec["done_at_ms"] = ms(T0[0])
    except Exception as e:  # noqa: BLE001  (any failure is a row's error)
        rec = {"kind": "error", "error": f"{type(e).__name__}: {e}"}
    with lock:
        out.append(rec)
    if sbx is not None:
        try:
            sbx.kill()
        except Exception:  # noqa: BLE001
            pass


def main() -> None:
    n = int(sys.argv[1])
    out: list = []
    lock = threading.Lock()
    start = threading.Event()
    created = None
    if os.environ.get("BURST_CREATES_FIRST") == "1":
        def mark() -> None:
            CREATED.update(ms=ms(T0[0]), cpu_s=time.process_time())
        created = threading.Barrier(n, action=mark)
    threads = [threading.Thread(target=one, args=(out, lock, start, created)) for _ in range(n)]
    for t in threads:
        t.start()
    T0[0] = time.perf_counter()
    start.set()
    for t in threads:
        t.join()
    for rec in out:
        print(json.dumps(rec))
    done = [r["done_at_ms"] for r in out if r["kind"] == "item"]
    print(json.dumps({"kind": "wall", "ms": max(done) if done else None}))
    if CREATED:
        print(json.dumps({"kind": "created", **CREATED}))
    for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 0):
        seq: list = []
        go = threading.Event()
        go.set()
        one(seq, lock, go)
        for rec in seq:
            if rec["kind"] == "item":
                rec = {"kind": "seq", "total_ms": rec["total_ms"]}
            print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
