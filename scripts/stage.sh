#!/usr/bin/env bash
# One stage of a test run, timed:
#
#   scripts/stage.sh NAME CMD [ARG...]   run CMD, print how long it took
#   scripts/stage.sh --table FILE [SECS] the stages recorded in FILE as a table
#                                        (SECS: the whole run's wall clock),
#                                        then one line `N passed, N failed`
#
# CMD's output passes through unchanged; its exit status is this script's.
# When STAGE_LOG names a file, a line for the stage is appended to it:
# name, seconds, exit status, the passed and failed counts read from the
# output, whether it is nested in another stage or has stages nested in it,
# what was counted (tests, or go test's packages), and how busy the host's
# CPUs were meanwhile (all of them, whatever ran: with stages side by side,
# where the run has room left). The counts are those of the last summary CMD printed:
#   `N passed, N failed`          compat-tests/run.sh's closing line
#   `ok  pkg` / `FAIL pkg`        go test's packages
#   `--- PASS: T` / `--- FAIL: T` a cgroup VM's top-level tests, from the
#                                 summary after its `=== cgroup-vm` line
#   `test result: … N passed; N failed` cargo test's, summed over its
#                                 test binaries
# A stage that runs stages itself (the two cgroup VMs side by side) records
# its time and status only, so that no test is counted twice.
set -uo pipefail

table() { # table FILE [SECS]
  awk -F'\t' -v wall="${2:-}" '
    BEGIN {
      printf "\n=== stages (seconds of wall clock; an indented stage ran inside the next one) ===\n"
      printf "%-18s %7s  %4s  %-8s %s\n", "stage", "seconds", "cpu%", "status", "tests"
    }
    {
      status = $3 == 0 ? "ok" : "FAIL(" $3 ")"
      tests = $4 == "" ? "-" : $4 " passed, " $5 " failed" ($8 == "" ? "" : " (" $8 ")")
      printf "%-18s %7d  %4s  %-8s %s\n", ($6 ? "  " : "") $1, $2, ($10 == "" ? "-" : $10), status, tests
      if (!$6) sum += $2
      pass += $4; fail += $5
      # A failed stage without a failed test of its own (a build or boot
      # failure, a runner that died) still counts as one failure.
      if ($3 != 0 && $5 + 0 == 0 && !$7) fail++
    }
    END {
      printf "%-18s %7d\n", "sum of stages", sum
      if (wall != "") printf "%-18s %7d\n", "whole run", wall
      printf "%d passed, %d failed\n", pass, fail
    }' "$1"
}

if [[ ${1:-} == --table ]]; then
  [[ -n ${2:-} ]] || { echo "usage: $0 --table FILE [SECS]" >&2; exit 2; }
  if [[ -s $2.failed ]]; then
    echo
    echo "=== what failed, by stage ==="
    cat "$2.failed"
  fi
  table "$2" "${3:-}"
  exit
fi
(($# >= 2)) || { echo "usage: $0 NAME CMD [ARG...] | --table FILE" >&2; exit 2; }
name=$1
shift

out=$(mktemp -t "stage-$name.XXXXXX")
trap 'rm -f "$out"' EXIT
# Nested stages (the cgroup VMs run by test-cgroup) report that they are
# nested, so the table's total adds up only the outer one.
nested=${STAGE_NESTED:-0}
# Stages run side by side (the VMs beside the SDK suites) append to the log
# at any time: a stage's nested stages are those that name it as their
# parent, not whatever was appended while it ran.
id="$name.$$.$RANDOM"
# cpu_ticks: the host's busy and total CPU ticks since boot (/proc/stat's
# first line: idle and iowait are not busy).
cpu_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat; }
read -r busy0 total0 < <(cpu_ticks)
start=$SECONDS
STAGE_NESTED=1 STAGE_PARENT_ID=$id "$@" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
took=$((SECONDS - start))
read -r busy1 total1 < <(cpu_ticks)
cpu=
((total1 > total0)) && cpu=$((100 * (busy1 - busy0) / (total1 - total0)))
echo "stage $name: $took s, exit status $rc, host CPU ${cpu:-?}% busy" >&2

[[ -n ${STAGE_LOG:-} ]] || exit "$rc"
pass= fail= parent=0 unit=tests
line=$(grep -aE '^[0-9]+ passed, [0-9]+ failed$' "$out" | tail -n1)
if awk -F'\t' -v id="$id" '$9 == id { found = 1 } END { exit !found }' "$STAGE_LOG" 2>/dev/null; then
  parent=1
elif [[ -n $line ]]; then
  read -r pass _ fail _ <<<"$line"
elif grep -aqE '^(ok|FAIL)[[:space:]]+[^[:space:]]+/' "$out"; then
  pass=$(grep -acE '^ok[[:space:]]' "$out")
  fail=$(grep -acE '^FAIL[[:space:]]+[^[:space:]]+/' "$out")
  unit=packages
elif grep -aqE '^test result: [A-Za-z]+\. [0-9]+ passed; [0-9]+ failed' "$out"; then
  read -r pass fail < <(sed -nE 's/^test result: [A-Za-z]+\. ([0-9]+) passed; ([0-9]+) failed.*/\1 \2/p' "$out" |
    awk '{ p += $1; f += $2 } END { print p, f }')
elif grep -aqE '^=== cgroup-vm .* summary' "$out"; then
  pass=$(sed -n '/^=== cgroup-vm .* summary/,$p' "$out" | grep -acE '^--- PASS: ')
  fail=$(sed -n '/^=== cgroup-vm .* summary/,$p' "$out" | grep -acE '^--- FAIL: ')
fi
[[ -n $pass ]] || unit=
# What failed, by name, for the recap above the table (a CI log's tail is
# often all one gets to see): go test's and the VMs' failed tests, the JS
# runner's `not ok`, pytest's FAILED/ERROR lines, cargo's `---- T stdout ----`.
if ((rc != 0)); then
  grep -aE '^\s*--- FAIL: |^FAIL\s+\S+/|^\s*not ok [0-9]+ - |^(FAILED|ERROR) tests/|^---- \S+ stdout ----$' "$out" |
    sed -E 's/^\s+//; s/ \([0-9.]+s\)$//' | awk '!seen[$0]++' | head -n 40 |
    sed "s/^/$name: /" >>"$STAGE_LOG.failed"
  # And why, for go test: the last lines a failed test logged (its
  # t.Fatal, not the INFO lines a backend logs through it), the first
  # lines of a data race report, which fails whatever test ran beside it,
  # and the first panic (a test binary's timeout is one).
  awk '
    function flush() { for (i = (n > 4 ? n - 4 : 0); i < n; i++) print "  " test ": " buf[i % 4]; n = 0 }
    /^[[:space:]]*--- FAIL: / { flush(); inblock = 1; ind = match($0, /[^[:space:]]/); test = $3; next }
    inblock && match($0, /[^[:space:]]/) > ind && $0 !~ /level=(INFO|DEBUG)/ { sub(/^[[:space:]]+/, ""); buf[n++ % 4] = substr($0, 1, 300); next }
    inblock && match($0, /[^[:space:]]/) <= ind { flush(); inblock = 0 }
    /^WARNING: DATA RACE$/ && races++ == 0 { race = 16 }
    race > 0 && /^=+$/ { race = 0 }
    race > 0 { print "  race: " $0; race-- }
    /^panic: / && panics++ == 0 { print "  " substr($0, 1, 300) }
    END { flush() }' "$out" | head -n 40 | sed "s/^/$name: /" >>"$STAGE_LOG.failed"
fi
printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$took" "$rc" "$pass" "$fail" "$nested" "$parent" "$unit" "${STAGE_PARENT_ID:-}" "$cpu" >>"$STAGE_LOG"
exit "$rc"
