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
# bubblewrap (the floor the create scenarios compare against) and the SDKs
# (the sdk and warm scenarios): without them those rows only say so.
./scripts/deps.sh >&2
if [[ ${BENCH_SKIP_BUILD:-} != 1 ]]; then
  make --no-print-directory build >&2
fi
"$GO" build -o bin/bench ./bench >&2
# The fake internet of the network scenario's download (compat-tests/fakeinet).
"$GO" build -o bin/fakeinet ./compat-tests/fakeinet >&2
# runc at the version whose libcontainer the local backend links: the
# libcontainer floor of the floor and create scenarios. Built once per
# version (it needs the Go module proxy the first time); without it those
# rows say why they are missing.
runc_version=$("$GO" list -m -f '{{.Version}}' github.com/opencontainers/runc)
if [[ ! -x bin/runc || $(cat bin/runc.version 2>/dev/null) != "$runc_version" ]]; then
  if CGO_ENABLED=1 GOBIN="$PWD/bin" "$GO" install -tags seccomp "github.com/opencontainers/runc@$runc_version" >&2; then
    echo "$runc_version" > bin/runc.version
  else
    echo "bench: could not build runc $runc_version; the libcontainer floor is left out" >&2
  fi
fi
exec ./bin/bench "$@"
