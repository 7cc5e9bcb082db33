#!/usr/bin/env python3
"""How long an idle agent waits for a CPU once woken, from a kernel trace.

    python3 bench/agent_wakeups.py TRACE OFFSET DIR/sandboxd.1.log

A claim from a warm pool wakes a member's agent that slept since its last
health check, for the claim's /init; under a flood the time until the agent
runs is most of the claim's tail. TRACE is the text of tracefs's
sched_wakeup and sched_switch events for the agents, on the mono clock;
OFFSET is the wall clock minus the monotonic one when it was taken, to place
the events among the log's audit lines. As root, around a run of
`./bin/bench -scenario fairness -sdk '' -fairness-pools -keep-logs`:

    T=/sys/kernel/tracing; mount -t tracefs nodev $T
    echo mono > $T/trace_clock; echo 8192 > $T/buffer_size_kb
    echo 'comm == "envd" || comm == "envd-rs"' > $T/events/sched/sched_wakeup/filter
    echo 'next_comm == "envd" || next_comm == "envd-rs" || prev_comm == "envd" || prev_comm == "envd-rs"' \\
        > $T/events/sched/sched_switch/filter
    echo 1 > $T/events/sched/sched_wakeup/enable; echo 1 > $T/events/sched/sched_switch/enable
    python3 -c 'import time; print(time.time() - time.monotonic())' > offset
    cat $T/trace_pipe > trace & echo 1 > $T/tracing_on
    ... the bench ...
    echo 0 > $T/tracing_on; kill %1   # then disable the events, umount $T

The tracing slows the box (the flood ran at about 60 % of its rate), so
compare runs traced alike. Counted are wakeups of an agent that had been
asleep for over a second; each is "flooded" when a create of tenant "a"
ended within 0.5 s of it, else "alone" (which includes the spare pool's
refills after the flood).
"""
import bisect
import json
import re
import sys
from datetime import datetime

AGENTS = ("envd", "envd-rs")
SWITCH = re.compile(r"\s(\d+\.\d+): sched_switch: prev_comm=(\S+) prev_pid=(\d+) prev_prio=\d+ "
                    r"prev_state=(\S+) ==> next_comm=(\S+) next_pid=(\d+)")
WAKEUP = re.compile(r"\s(\d+\.\d+): sched_wakeup: comm=(\S+) pid=(\d+)")


def flood_times(log):
    """End times of tenant a's creates, sorted."""
    out = []
    for line in open(log):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("action") == "create" and rec.get("result") == "ok" and rec.get("tenant") == "a":
            out.append(datetime.fromisoformat(rec["time"].replace("Z", "+00:00")).timestamp())
    return sorted(out)


def waits(trace, offset, floods):
    """Wakeup-to-run times in ms of agents idle for over a second, by flooded."""
    asleep_since, pending = {}, {}
    out = {False: [], True: []}
    for line in open(trace):
        m = WAKEUP.search(line)
        if m:
            t, pid = float(m.group(1)), m.group(3)
            if pid in asleep_since and t - asleep_since[pid] > 1.0:
                pending[pid] = t
            continue
        m = SWITCH.search(line)
        if not m:
            continue
        t, prev_comm, prev_pid, prev_state, next_comm, next_pid = m.groups()
        t = float(t)
        if prev_comm in AGENTS:
            if prev_state.startswith("S"):
                asleep_since[prev_pid] = t
            else:
                asleep_since.pop(prev_pid, None)
        if next_comm in AGENTS and next_pid in pending:
            woke = pending.pop(next_pid)
            wall = woke + offset
            i = bisect.bisect_left(floods, wall - 0.5)
            out[i < len(floods) and floods[i] < wall + 0.5].append((t - woke) * 1000)
    return out


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    trace, offset, log = sys.argv[1], float(open(sys.argv[2]).read()), sys.argv[3]
    for flooded, v in sorted(waits(trace, offset, flood_times(log)).items()):
        if not v:
            continue
        v.sort()
        n = len(v)
        print("%-7s %4d wakeups, woken to running ms: p50 %.3f p90 %.3f p99 %.3f max %.3f" % (
            "flooded" if flooded else "alone", n, v[n // 2], v[int(n * 0.9)], v[min(n - 1, int(n * 0.99))], v[-1]))


if __name__ == "__main__":
    main()
