#!/usr/bin/env bash
# What a create would cost with an in-sandbox agent without a Go runtime:
# builds bench/agentfloor/agent.c (the least agent a create needs: it
# answers sandboxd's /init and nothing else), puts it in envd's place in a
# copy of bin/, and runs profile-burst.sh on bin/ and on the copy in turn,
# ROUNDS times, printing each run's CPU per create (all processes) and the
# burst's p99. issue 24's notebook section "An agent without a Go runtime"
# was made with it. Needs root, perf and a C compiler with a static libc
# (Debian: gcc, libc6-dev, linux-perf).
#
#   ./bench/agent-floor.sh [ROUNDS]    # default 3
#
# The copy stays in bench/out/agent-floor-bin, for the bench's other
# scenarios: `./bench/run.sh -scenario spare,fairness -sdk '' -bin
# bench/out/agent-floor-bin` (rows that run a command fail there: the agent
# serves none).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
command -v cc >/dev/null || { echo "agent-floor: needs a C compiler (apt-get install gcc libc6-dev)" >&2; exit 1; }
if [[ ${BENCH_SKIP_BUILD:-} != 1 ]]; then
  make --no-print-directory build >&2
fi
floor=bench/out/agent-floor-bin
rm -rf "$floor"
mkdir -p "$floor"
cp -a bin/. "$floor/"
cc -O2 -Wall -static -o "$floor/envd" bench/agentfloor/agent.c
echo "| run | agent | sandboxd | agent (envd) | sandboxd-spawn | kernel threads | all four, ms a create | burst of 100, p99 ms |"
echo "|---|---|--:|--:|--:|--:|--:|--:|"
for ((i = 1; i <= rounds; i++)); do
  for b in bin "$floor"; do
    name=envd
    [[ $b == "$floor" ]] && name=agentfloor
    PROFILE_BIN=$PWD/$b BENCH_SKIP_BUILD=1 ./bench/profile-burst.sh 100 2>&1 |
      awk -F'|' -v run="$i" -v name="$name" '
        function num(s) { gsub(/ /, "", s); return s + 0 }
        /^\| burst \| 100 concurrent cold creates \(no pool\), each/ { p99 = num($8) }
        /^\| / { k = $2; gsub(/^ +| +$/, "", k); v[k] = num($3) }
        END {
          t = v["sandboxd"] + v["envd"] + v["sandboxd-spawn"] + v["kernel threads"]
          printf "| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %s |\n", run, name, v["sandboxd"], v["envd"], v["sandboxd-spawn"], v["kernel threads"], t, p99
        }'
  done
done
echo "(load $(cut -d' ' -f1-3 /proc/loadavg); $(nproc) CPUs)"
