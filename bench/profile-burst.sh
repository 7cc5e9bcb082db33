#!/usr/bin/env bash
# Where the CPU of a cold create goes: runs the burst scenario (N concurrent
# cold creates through the E2B API, then their destroys) under a system-wide
# `perf record` and prints the CPU time per create of each process kind:
# sandboxd itself, sandboxd-spawn (or, without it, libcontainer's init
# re-exec runc:[2:INIT] and its nsexec stages), envd, the kernel's workers,
# and idle. docs/benchmarks-history.md, "Where the
# CPU of a cold create goes", was made with it. Needs root and perf (Debian:
# linux-perf); whatever else runs on the box shows up in its own rows.
#
#   ./bench/profile-burst.sh [N]    # default 100
#
# PROFILE_BIN=DIR profiles the binaries in DIR (the bench's -bin) instead of
# bin/: a directory without sandboxd-spawn measures libcontainer's start.
# PROFILE_ROUNDS=R fires R bursts, each destroyed before the next, and
# profiles the last (-burst-rounds): a host that has created and destroyed
# before, whose parked memory cgroups the next creates take.
#
# perf counts from the first create to 2.5 s after the last destroy (the
# bench turns it on and off through perf's control fifos): sandboxd's
# start-up and shutdown are not a create's. PROFILE_WHOLE=1 counts the
# whole run, as figures before 2026-12-04 12:00Z did.
#
# With PROFILE_KERNEL=1 it also records call stacks and lists the kernel's
# functions with the most CPU per create over every process (idle left
# out), each counting what it calls: where a create's kernel work goes
# (clone into new namespaces, mounts, exec, exit, a network namespace's
# cleanup, cgroup directories, netlink), whichever process did it.
#
# With PROFILE_COMM set (sandboxd, envd, ...), it also records call stacks
# and lists the functions of that process kind with the most CPU per
# create, each counting what it calls, then its CPU by where it was spent:
# the kernel or the Go package of the innermost frame. The kernel's frames
# always come out; in a system-wide record perf often stops at the Go side
# of a syscall, so for Go frames profile the process itself.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100}
command -v perf >/dev/null || { echo "profile-burst: needs perf (apt-get install linux-perf)" >&2; exit 1; }
out=$(mktemp -d)
trap 'kept=$(sed -n "s/^bench: binaries kept in //p" "$out/bench.err" 2>/dev/null); [[ -n $kept ]] && rm -rf "$kept"; rm -rf "$out"' EXIT
if [[ ${BENCH_SKIP_BUILD:-} != 1 ]]; then
  make --no-print-directory build >&2
fi
go build -o bin/bench ./bench
freq=1999
# The bench runs copies of the binaries; with PROFILE_COMM they are kept
# until perf has read their symbols (Go's frames).
export BENCH_KEEP_BINS=${PROFILE_COMM:+1}
window=()
if [[ ${PROFILE_WHOLE:-} != 1 ]]; then
  mkfifo "$out/ctl" "$out/ack"
  # perf opens the ack fifo to write before it starts the bench, which
  # would block it until a reader comes: this shell holds one open.
  exec 9<>"$out/ack"
  window=(-D -1 --control "fifo:$out/ctl,$out/ack")
  export BENCH_PERF_CTL="$out/ctl,$out/ack"
fi
stacks=
[[ -n ${PROFILE_COMM:-} || ${PROFILE_KERNEL:-} == 1 ]] && stacks=-g
perf record -q -a -F "$freq" $stacks "${window[@]}" -o "$out/perf.data" -- \
  ./bin/bench -scenario burst -burst "$n" -burst-rounds "${PROFILE_ROUNDS:-1}" ${PROFILE_BIN:+-bin "$PROFILE_BIN"} -out "$out/results.json" 2>"$out/bench.err" | grep -E '^\| burst' || true
perf script -i "$out/perf.data" -F comm 2>/dev/null |
  awk -v n="$n" -v f="$freq" '
    { c=$0; sub(/^ +/, "", c); sub(/ +$/, "", c)
      if (c ~ /^kworker|^ksoftirqd|^rcu|^migration|^kcompactd|^khugepaged|^kswapd/) c="kernel threads"
      # libcontainer execs its sealed copy of sandboxd as /proc/self/fd/N:
      # the new process is named N until nsexec renames it.
      if (c ~ /^[0-9]+$/) c="init exec (ld.so, before nsexec)"
      cnt[c]++; tot++ }
    END {
      printf "| process | CPU per create (ms) | share |\n|---|--:|--:|\n"
      for (k in cnt) if (cnt[k]*1000/f/n >= 0.05) printf "| %s | %.2f | %.0f%% |\n", (k=="swapper" ? "idle (swapper)" : k), cnt[k]*1000/f/n, 100*cnt[k]/tot | "sort -t\"|\" -k3 -rn"
    }'
echo "($n creates and destroys; perf at $freq Hz on all CPUs, $([[ ${PROFILE_WHOLE:-} == 1 ]] && echo "the whole run" || echo "from the first create to 2.5 s after the last destroy"); $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg))"
# The listings end with awk, not head: head would end sort with SIGPIPE,
# which pipefail turns into the script's failure before the next listing.
if [[ -n ${PROFILE_COMM:-} ]]; then
  echo
  echo "$PROFILE_COMM: functions by CPU per create, callees included (top ${PROFILE_TOP:-40})"
  perf script -i "$out/perf.data" --comm "$PROFILE_COMM" -F comm,ip,sym 2>/dev/null |
    awk -v n="$n" -v f="$freq" '
      function flush() { for (s in seen) cnt[s]++; delete seen }
      /^[^ \t]/ { flush(); next }      # a sample: its stack follows
      NF >= 2 { s=$2; sub(/\+0x[0-9a-f]+$/, "", s); if (s != "[unknown]") seen[s]=1 }
      END { flush(); for (s in cnt) printf "%8.2f ms  %s\n", cnt[s]*1000/f/n, s }' |
    sort -rn | awk -v k="${PROFILE_TOP:-40}" 'NR <= k'
  echo
  echo "$PROFILE_COMM: CPU per create by where it was spent (each sample's innermost frame): the kernel, or the Go package of the function"
  perf script -i "$out/perf.data" --comm "$PROFILE_COMM" -F comm,ip,sym 2>/dev/null |
    awk -v n="$n" -v f="$freq" '
      /^[^ \t]/ { leaf=1; next }
      leaf && NF >= 2 {
        leaf=0; s=$2; sub(/\+0x[0-9a-f]+$/, "", s)
        if ($1 ~ /^ffff/) p="[kernel]"
        else if (s == "[unknown]") p=s
        else {
          # a Go symbol: the package is its path up to the first dot after the last slash
          k=split(s, seg, "/"); last=seg[k]; d=index(last, ".")
          p=(d ? substr(s, 1, length(s)-length(last)+d-1) : s)
        }
        cnt[p]++
      }
      END { for (p in cnt) printf "%8.2f ms  %s\n", cnt[p]*1000/f/n, p }' |
    sort -rn | awk -v k="${PROFILE_TOP:-40}" 'NR <= k'
fi
if [[ ${PROFILE_KERNEL:-} == 1 ]]; then
  echo
  echo "kernel functions by CPU per create, every process but idle, callees included (top ${PROFILE_TOP:-40})"
  perf script -i "$out/perf.data" -F comm,ip,sym 2>/dev/null |
    awk -v n="$n" -v f="$freq" '
      function flush() { if (!idle) for (s in seen) cnt[s]++; delete seen }
      /^[^ \t]/ { flush(); c=$0; sub(/^ +/, "", c); idle = (c ~ /^swapper/); next }
      # kernel frames only: their addresses are in the top half
      NF >= 2 && $1 ~ /^ffff/ { s=$2; sub(/\+0x[0-9a-f]+$/, "", s); if (s != "[unknown]") seen[s]=1 }
      END { flush(); for (s in cnt) printf "%8.2f ms  %s\n", cnt[s]*1000/f/n, s }' |
    sort -rn | awk -v k="${PROFILE_TOP:-40}" 'NR <= k'
fi
