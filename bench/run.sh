#!/usr/bin/env bash
# Builds sandboxd, envd and the bench program, then runs the benchmark suite
# (the default set unless arguments say otherwise) against a sandboxd it
# starts itself. The markdown table goes to stdout, progress to stderr, the
# JSON to bench/out/results.json. `make bench` calls this.
#
#   ./bench/run.sh                         # default set
#   ./bench/run.sh -scenario exec,create   # some scenarios
#   ./bench/run.sh -quick                  # smoke run, tiny N
#   ./bench/run.sh -density 500            # push density
#   BENCH_ARGS="-n 200" make bench         # arguments through make
#
# Needs root (the local backend). See BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

if [[ $(id -u) -ne 0 ]]; then
  echo "bench: run as root (the local backend creates namespaces, mounts and cgroups)" >&2
  exit 1
fi
if [[ ${BENCH_SKIP_BUILD:-} != 1 ]]; then
  make --no-print-directory build >&2
fi
"$GO" build -o bin/bench ./bench >&2
exec ./bin/bench "$@"
