#!/usr/bin/env bash
# What a create would cost with an in-sandbox agent without a Go runtime:
# builds bench/agentfloor/agent.c and agent.rs (the least agent a create
# needs, in C and in Rust: each answers sandboxd's /init and nothing else)
# and bench/agentfloor/hyper (the same in Rust on the HTTP stack a full agent
# would use: hyper's HTTP/1.1 and h2c on tokio's current-thread runtime),
# puts each in envd's place in a copy of bin/, and runs profile-burst.sh on
# a copy with envd (Go) and on the others in turn, ROUNDS times, printing each run's CPU per
# create (all processes) and the burst's p99. The notebook's section "An
# agent without a Go runtime" was made with it. Needs root, perf and a C
# compiler with a static libc (Debian: gcc, libc6-dev, linux-perf); the Rust
# agents are left out without rustc and cargo (hyper's crates come from
# crates.io, pinned by its Cargo.lock).
#
#   ./bench/agent-floor.sh [ROUNDS]    # default 3
#
# It also runs envd-rs (bin/envd-rs, the full agent in Rust, when make built
# it) in envd's place. AGENTS="envd-rs" (any of c, rust, hyper, envd-rs)
# runs only those beside envd.
#
# The copies stay in bench/out/agent-floor-{envd,c,rust,hyper,envd-rs}, for the
# bench's other scenarios: `./bench/run.sh -scenario spare,fairness -sdk ''
# -bin bench/out/agent-floor-c` (rows that run a command fail there: the
# least agents serve none; envd-rs serves everything).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
agents=" ${AGENTS:-c rust hyper envd-rs} "
command -v cc >/dev/null || { echo "agent-floor: needs a C compiler (apt-get install gcc libc6-dev)" >&2; exit 1; }
if [[ ${BENCH_SKIP_BUILD:-} != 1 ]]; then
  make --no-print-directory build >&2
fi
# A copy of bin/ whose agent is the envd in it: without envd-rs, which the
# bench (as sandboxd serve) would otherwise pick.
copy() {
  rm -rf "bench/out/agent-floor-$1"
  mkdir -p "bench/out/agent-floor-$1"
  cp -a bin/. "bench/out/agent-floor-$1/"
  rm -f "bench/out/agent-floor-$1/envd-rs"
}
copy envd
variants=(bench/out/agent-floor-envd)
if [[ $agents == *" c "* ]]; then
  copy c
  cc -O2 -Wall -static -o bench/out/agent-floor-c/envd bench/agentfloor/agent.c
  variants+=(bench/out/agent-floor-c)
fi
if [[ $agents == *" rust "* ]] && command -v rustc >/dev/null; then
  copy rust
  rustc --edition 2021 -O -C target-feature=+crt-static -C strip=symbols -o bench/out/agent-floor-rust/envd bench/agentfloor/agent.rs
  variants+=(bench/out/agent-floor-rust)
fi
if [[ $agents == *" hyper "* ]] && command -v cargo >/dev/null; then
  copy hyper
  target=$(rustc -vV | sed -n 's/^host: //p')
  RUSTFLAGS="-C target-feature=+crt-static" cargo build -q --release --locked --target "$target" \
    --manifest-path bench/agentfloor/hyper/Cargo.toml --target-dir bench/out/agent-floor-target
  cp "bench/out/agent-floor-target/$target/release/agentfloor-hyper" bench/out/agent-floor-hyper/envd
  variants+=(bench/out/agent-floor-hyper)
fi
if [[ $agents == *" envd-rs "* && -x bin/envd-rs ]]; then
  copy envd-rs
  cp bin/envd-rs bench/out/agent-floor-envd-rs/envd
  variants+=(bench/out/agent-floor-envd-rs)
fi
echo "| run | agent | sandboxd | agent (envd) | sandboxd-spawn | kernel threads | all four, ms a create | burst of 100, p99 ms |"
echo "|---|---|--:|--:|--:|--:|--:|--:|"
for ((i = 1; i <= rounds; i++)); do
  for b in "${variants[@]}"; do
    name=${b#bench/out/agent-floor-}
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
