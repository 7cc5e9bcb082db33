#!/usr/bin/env python3
"""Where a create's time goes, from a sandboxd log at debug level.

    python3 bench/create_phases.py DIR/sandboxd.1.log

Reads the local backend's "sandbox started" lines (the bench keeps the log
with -keep-logs; -fairness-serve-args '--log-level debug' for the fairness
scenario) and prints p50/p90 of each phase and of the kernel's schedstat
figures: threadCPU/threadRunqueue are sandboxd's thread on a CPU and waiting
for one, envdCPU/envdRunqueue the sandbox's init and envd until envd
answered. Creates someone waited for are split into those with no
background create (a flood's, a refill) within 0.3 s, "alone", and the
others, "flooded"; background creates are left out. Where a flood's creates
are not background ones (the fairness scenario's unbounded halves), all
count as "alone".
"""
import bisect
import json
import re
import sys
from datetime import datetime

PHASES = ["mounts", "net", "config", "run", "route", "health"]
SCHED = ["threadCPU", "threadRunqueue", "envdCPU", "envdRunqueue"]
UNITS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1000.0}


def ms(v):
    """slog's JSON writes a time.Duration as integer nanoseconds."""
    if isinstance(v, (int, float)):
        return v / 1e6
    m = re.fullmatch(r"([\d.]+)(ns|µs|us|ms|s)", v)
    if not m:
        raise ValueError(f"not a duration: {v!r}")
    return float(m.group(1)) * UNITS[m.group(2)]


def pct(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def main(path):
    creates = []
    with open(path) as f:
        for line in f:
            if '"sandbox started"' not in line:
                continue
            d = json.loads(line)
            t = datetime.fromisoformat(d["time"].replace("Z", "+00:00")).timestamp()
            creates.append((t, d))
    background = sorted(t for t, d in creates if d.get("background"))
    groups = {"alone": [], "flooded": []}
    for t, d in creates:
        if d.get("background"):
            continue
        i = bisect.bisect_left(background, t - 0.3)
        flooded = i < len(background) and background[i] <= t + 0.3
        groups["flooded" if flooded else "alone"].append(d)
    if not any(groups.values()):
        sys.exit(f"{path}: no \"sandbox started\" line (is the log at debug level?)")
    print("| creates | n | total | " + " | ".join(PHASES + SCHED) + " |")
    print("|---" * (3 + len(PHASES) + len(SCHED)) + "|")
    for name, ds in groups.items():
        if not ds:
            continue
        cells = []
        total = [sum(ms(d[k]) for k in PHASES) for d in ds]
        cells.append(f"{pct(total, 50):.2f} / {pct(total, 90):.2f}")
        for k in PHASES + SCHED:
            v = [ms(d[k]) for d in ds if k in d]
            cells.append(f"{pct(v, 50):.2f} / {pct(v, 90):.2f}" if v else "—")
        print(f"| {name} | {len(ds)} | " + " | ".join(cells) + " |")
    print("\nms, p50 / p90 over the creates of each group")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
