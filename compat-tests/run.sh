#!/usr/bin/env bash
# Runs E2B's real SDKs (JS `e2b` from npm, Python `e2b` from PyPI) in two
# modes, then prints ONE closing line `N passed, N failed` (every suite of
# every mode together). Exits non-zero if anything failed or if no test ran.
# See compat-tests/README.md.
#
#   debug     the SDKs' debug mode against bin/envd on 127.0.0.1:49983
#   sandboxd  the SDKs against a real bin/sandboxd (control plane + local
#             backend) on a free loopback port, with a fresh data dir, run dir
#             and API key; afterwards every sandbox still listed is killed
#             through the API and counted as a failure (a leak), sandboxd gets
#             SIGTERM, and the run dir's sandboxes/ must be empty
#   incus     the same with `sandboxd serve --backend incus` (needs Incus as
#             scripts/incus-setup.sh prepares it); in addition no Incus
#             instance made during the run may be left afterwards
#   cluster   the incus mode on the three-member test cluster of
#             scripts/incus-cluster.sh (`up` first): `sandboxd serve
#             --backend incus --incus-remote …` with the cluster's env file,
#             sandboxes spread over the members and reached through their
#             relays; the network is the members' (no fake internet: the
#             network suites skip); no instance of the run may be left on
#             the cluster
#   domain    the sandboxd mode reached as the SDKs' next major version
#             reaches E2B: E2B_DOMAIN only (no E2B_API_URL/E2B_SANDBOX_URL),
#             over TLS, by host routing. sandboxd serves HTTPS on a free
#             loopback port with --domain sandboxd.localhost:PORT and a
#             certificate of `sandboxd tls init` (its CA given to the runners
#             as SSL_CERT_FILE and NODE_EXTRA_CA_CERTS). The runners resolve
#             api.sandboxd.localhost and <port>-<id>.sandboxd.localhost as a
#             laptop without DNS of its own does: nss-myhostname (Debian's
#             libnss-myhostname) maps every *.localhost name to loopback; they
#             run in a mount namespace of their own whose /etc/nsswitch.conf
#             lists it, so the host's is left alone
#
# In the sandboxd and incus modes compat-tests/fakeinet stands in for the
# internet: a network namespace of its own on a free /29 of 192.52.193.0/24
# with two servers, ONE and TWO (HTTP on 80, HTTPS on 443), and a DNS server
# on ONE that knows the network suites' names (*.sbx.test) and forwards the
# rest to the host's resolvers. sandboxd gets --egress-dns=ONE, so every
# sandbox resolves through it; the suites get COMPAT_INET_ONE and
# COMPAT_INET_TWO (the network tests skip without them). If it cannot start,
# that counts as one failure and the suites run without it.
#
# Environment:
#   COMPAT_TARGET="debug sandboxd"  which modes to run, in order (default
#                             debug and sandboxd; incus and domain must be
#                             asked for)
#   E2B_SDK_VERSION=latest    test the newest SDKs instead of the pinned ones
#                             (installed into a temporary directory; the
#                             pinned lock files are left alone)
#   E2B_JS_SDK_VERSION=X      the same for the JS SDK only (npm version/tag)
#   E2B_PY_SDK_VERSION=X      the same for the Python SDK only (PyPI version,
#                             or `latest`)
#   COMPAT_SUITES="js py"     which suites to run (default both)
#   COMPAT_SKIP_IF_PINNED=1   with `latest`: skip a suite whose newest SDKs
#                             are the pinned ones (JS: e2b and
#                             @e2b/code-interpreter; Python: e2b), which the
#                             pinned run tests already; if the registry
#                             cannot say, the suite runs
#   COMPAT_LOG_DIR=DIR        where the logs and the runners' output go
#                             (default: a fresh temp dir, printed at the end)
#   COMPAT_ENVD=PATH          the agent (default bin/envd-rs where built, else
#                             bin/envd); sandboxd mode hands it to sandboxd
#                             (--envd), cluster mode pushes it to the members
#   COMPAT_SANDBOXD=PATH      sandboxd binary (default bin/sandboxd)
#   COMPAT_JS_TESTS="a b"     JS test files to run, relative to js/test
#                             (default: all *.test.mjs)
#   COMPAT_JS_SKIP="a b"      JS test files to leave out of those
#   COMPAT_PY_ARGS="..."      extra pytest arguments, e.g. "-k watch -x"
#   COMPAT_SERVE_ARGS="..."   more flags for sandboxd serve, e.g.
#                             --code-interpreter=off where no test needs it
#   COMPAT_EGRESS_SUBNET=CIDR sandboxd mode: the --egress-subnet sandboxd gets
#                             where the code-interpreter build needs an
#                             --egress-allow-cidr (default 10.198.0.0/16);
#                             runs at once on one host each take their own
#   COMPAT_WIRELOG=1          debug mode: put envd on 127.0.0.1:49984 behind
#                             wirelog.py on :49983 and log all traffic to
#                             $COMPAT_LOG_DIR/wire.log
set -uo pipefail

cd "$(dirname "$0")/.."
root=$PWD
here=$root/compat-tests
port=49983
# The agent sandboxd serve picks: envd-rs where built, else envd.
envd_bin=${COMPAT_ENVD:-$root/bin/envd-rs}
[[ -n ${COMPAT_ENVD:-} || -f $envd_bin ]] || envd_bin=$root/bin/envd
envd_bin=$(realpath -m "$envd_bin") # absolute: the suites run in their own directories
sandboxd_bin=${COMPAT_SANDBOXD:-$root/bin/sandboxd}
suites=${COMPAT_SUITES:-js py}
targets=${COMPAT_TARGET:-debug sandboxd}
# cluster mode: the test cluster of scripts/incus-cluster.sh, its env file
# and the host incus CLI's configuration pointing at it.
cluster_env=/var/lib/sandboxd-cluster/env
cluster_conf=/var/lib/sandboxd-cluster/incus
incus_cli() {
  if [[ ${mode_backend_cli:-} == cluster ]]; then INCUS_CONF=$cluster_conf incus "$@"; else incus "$@"; fi
}
log_dir=${COMPAT_LOG_DIR:-$(mktemp -d -t compat-tests.XXXXXX)}
mkdir -p "$log_dir"
log_dir=$(cd "$log_dir" && pwd)
js_ver=${E2B_JS_SDK_VERSION:-${E2B_SDK_VERSION:-}}
py_ver=${E2B_PY_SDK_VERSION:-${E2B_SDK_VERSION:-}}
started_at=$SECONDS

die() { echo "compat-tests: $*" >&2; echo "0 passed, 1 failed"; exit 1; }

# newest_is_pinned SUITE: whether the registry's newest SDKs of SUITE are
# the ones the pinned run installs.
newest_is_pinned() {
  local pinned newest
  case $1 in
    js)
      pinned=$(node -p "const d = require('$here/js/package.json').dependencies; d.e2b + ' ' + d['@e2b/code-interpreter']") || return 1
      newest="$(npm view e2b version 2>/dev/null) $(npm view @e2b/code-interpreter version 2>/dev/null)" ;;
    py)
      pinned=$(sed -n 's/^e2b==//p' "$here/python/requirements.txt")
      newest=$(python3 -m pip index versions e2b 2>/dev/null | sed -n 's/^e2b (\(.*\))$/\1/p') ;;
  esac
  echo "compat-tests: $1: newest SDKs '$newest', pinned '$pinned'" >&2
  [[ -n $pinned && $newest == "$pinned" ]]
}
if [[ -n ${COMPAT_SKIP_IF_PINNED:-} ]]; then
  kept=
  for s in $suites; do
    ver=$js_ver; [[ $s == py ]] && ver=$py_ver
    if [[ $ver == latest ]] && newest_is_pinned "$s"; then
      echo "compat-tests: $s suite skipped: its newest SDKs are the pinned ones, which the pinned run tests"
    else
      kept="$kept $s"
    fi
  done
  suites=${kept# }
  if [[ -z $suites ]]; then
    echo "compat-tests: nothing to run: every suite's newest SDKs are the pinned ones"
    exit 0
  fi
fi

for t in $targets; do
  case $t in
    debug) [[ -x $envd_bin ]] || die "$envd_bin is missing: run 'make build' first" ;;
    sandboxd|incus|domain)
      [[ -x $envd_bin ]] || die "$envd_bin is missing: run 'make build' first"
      [[ -x $sandboxd_bin ]] || die "$sandboxd_bin is missing: run 'make build' first" ;;&
    incus) incus query /1.0 >/dev/null 2>&1 || die "incus mode: Incus does not answer (run scripts/incus-setup.sh)" ;;
    cluster)
      [[ -r $cluster_env ]] || die "cluster mode: no $cluster_env (run scripts/incus-cluster.sh up)"
      INCUS_CONF=$cluster_conf incus query /1.0 >/dev/null 2>&1 || die "cluster mode: the test cluster does not answer (scripts/incus-cluster.sh status)" ;;
    domain)
      ldconfig -p | grep libnss_myhostname >/dev/null || die "domain mode: libnss-myhostname is not installed (scripts/deps.sh installs it)" ;;
    debug|sandboxd) ;;
    *) die "COMPAT_TARGET: unknown mode '$t' (want debug, sandboxd, incus, cluster and/or domain)" ;;
  esac
done

# Dependencies, among them the account `user` that envd runs commands as
# unless told otherwise: scripts/deps.sh is idempotent and quick when nothing
# is missing, so a fresh clone works too.
"$root/scripts/deps.sh" || die "installing dependencies failed"

umask 022
tmp_dirs=()
envd_pid=
proxy_pid=
sbxd_pid=
sbxd_port=
sbxd_key=
sbxd_run=
sbxd_args=() # extra `sandboxd serve` flags of the current mode
sbxd_domain= # its --domain
sbxd_url=    # its origin for this script's own calls (https in domain mode)
sbxd_ca=     # the CA of its certificate (domain mode)
runner=()    # what the runners run under (domain mode: the nsswitch namespace)
reg_pid=     # the test image's registries (start_registry)
reg_env=()
inet_pid=    # the fake internet (start_fakeinet)
inet_env=()
stop() { # stop PID [SECONDS]: SIGTERM, then SIGKILL after SECONDS (10)
  if kill "$1" 2>/dev/null; then
    for _ in $(seq 1 $((${2:-10} * 10))); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$1" 2>/dev/null
  fi
  wait "$1" 2>/dev/null
}
# unmount_volumes DIR: a stopped sandboxd leaves its volumes mounted (they
# outlive it by design); a data dir being removed takes them along.
unmount_volumes() {
  local m
  for m in $(awk -v d="$1/volumes/" 'index($2, d) == 1 {print $2}' /proc/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
}
cleanup() {
  [[ -n $reg_pid ]] && stop "$reg_pid"
  [[ -n $inet_pid ]] && stop "$inet_pid"
  [[ -n $proxy_pid ]] && stop "$proxy_pid"
  [[ -n $envd_pid ]] && stop "$envd_pid"
  if [[ -n $sbxd_pid ]]; then # interrupted in sandboxd mode
    reap_sandboxes >&2
    stop "$sbxd_pid"
    remove_run_dir
  fi
  for d in "${tmp_dirs[@]}"; do unmount_volumes "$d"; rm -rf "$d"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# http_status PORT PATH: the status line of GET PATH on 127.0.0.1:PORT.
http_ok() {
  local line
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' "$2" >&3
  IFS= read -r -t 2 line <&3
  exec 3<&-
  [[ $line =~ ^HTTP/1\.[01]\ 2[0-9][0-9] ]]
}
# sbxd_up: whether sandboxd answers GET /health with 2xx (over TLS, trusting
# its CA, in domain mode).
sbxd_up() {
  if [[ $sbxd_url == https:* ]]; then
    SSL_CERT_FILE=$sbxd_ca python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$sbxd_url/health" 2>/dev/null
  else
    http_ok "$sbxd_port" /health 2>/dev/null
  fi
}
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

total_pass=0
total_fail=0
ran_any=0
summary=()
mode_env=() # `env` arguments for the runners of the current mode

# count FILE REGEX: the first capture group of the last matching line, or 0.
count() { grep -aoE "$2" "$1" | tail -n1 | grep -oE '[0-9]+' | head -n1 || true; }

run_js() { # run_js MODE
  local mode=$1 dir=$here/js out=$log_dir/js-$1.tap ver
  if [[ -n $js_ver ]]; then
    dir=$(mktemp -d -t compat-js.XXXXXX); tmp_dirs+=("$dir")
    cp -r "$here/js/test" "$dir/"
    printf '{"name":"compat-js-latest","private":true,"type":"module"}\n' >"$dir/package.json"
    # The code-interpreter SDK too: the newest with the newest e2b, else the pinned one.
    local ci_ver=latest
    [[ $js_ver != latest ]] && ci_ver=$(node -p "require('$here/js/package.json').dependencies['@e2b/code-interpreter']")
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error "e2b@$js_ver" "@e2b/code-interpreter@$ci_ver") >&2 \
      || { echo "compat-tests: npm install e2b@$js_ver @e2b/code-interpreter@$ci_ver failed" >&2; total_fail=$((total_fail + 1)); return; }
  fi
  ver=$(node -p "require('$dir/node_modules/e2b/package.json').version" 2>/dev/null)
  local js_files=("$dir"/test/*.test.mjs)
  js_files=("${js_files[@]#"$dir/"}")
  if [[ -n ${COMPAT_JS_TESTS:-} ]]; then read -ra js_files <<<"$(printf 'test/%s ' $COMPAT_JS_TESTS)"; fi
  local skip file kept=()
  for file in "${js_files[@]}"; do
    for skip in ${COMPAT_JS_SKIP:-}; do [[ $file == "test/$skip" ]] && continue 2; done
    kept+=("$file")
  done
  js_files=("${kept[@]}")
  # The code-interpreter file runs last, in a runner of its own: the wait
  # for the template sandboxd builds at start (pip from PyPI, Deno from npm;
  # 60-110 s in CI) overlaps the other files instead of preceding them. A
  # file has --test-timeout in all, which cannot also cover that wait, so
  # the wait stays here, between the two runners.
  local first=() last=() file
  for file in "${js_files[@]}"; do
    if [[ $file == *codeinterpreter* ]]; then last+=("$file"); else first+=("$file"); fi
  done
  echo "=== [$mode] JS suite: e2b@$ver (node $(node --version))"
  : >"$out"
  js_pass=0 js_fail=0
  ((${#first[@]} == 0)) || run_js_files "$dir" "$out" "${first[@]}"
  if ((${#last[@]})); then
    [[ $mode == debug ]] || wait_code_interpreter
    run_js_files "$dir" "$out" "${last[@]}"
  fi
  echo "[$mode] JS: $js_pass passed, $js_fail failed"
  summary+=("[$mode] JS: $js_pass passed, $js_fail failed")
  total_pass=$((total_pass + js_pass)); total_fail=$((total_fail + js_fail)); ran_any=$((ran_any + js_pass + js_fail))
}

# run_js_files DIR OUT FILE...: one node test runner over FILEs (relative to
# DIR), its TAP (first in OUT.part, beside OUT in the log dir) appended to
# OUT and its counts added to js_pass and js_fail
# (cancelled tests, and a runner that printed no summary, are failures).
run_js_files() {
  local dir=$1 out=$2 part=$2.part n
  shift 2
  (cd "$dir" && "${runner[@]}" env "${mode_env[@]}" timeout --kill-after=10 1200 node --test --test-reporter=tap --test-concurrency=1 \
    --test-timeout=300000 "$@") 2>&1 | tee "$part"
  cat "$part" >>"$out"
  if ! grep -aqE '^# pass [0-9]+' "$part"; then
    echo "compat-tests: the JS runner printed no summary ($*)" >&2; js_fail=$((js_fail + 1))
  fi
  n=$(count "$part" '^# pass [0-9]+'); js_pass=$((js_pass + ${n:-0}))
  n=$(count "$part" '^# fail [0-9]+'); js_fail=$((js_fail + ${n:-0}))
  n=$(count "$part" '^# cancelled [0-9]+'); js_fail=$((js_fail + ${n:-0}))
  rm -f "$part"
}

run_py() { # run_py MODE
  local mode=$1 venv=$here/python/.venv out=$log_dir/py-$1.txt ver
  if [[ -n $py_ver ]]; then
    local d; d=$(mktemp -d -t compat-py.XXXXXX); tmp_dirs+=("$d")
    venv=$d/venv
    local spec=e2b; [[ $py_ver != latest ]] && spec="e2b==$py_ver"
    { python3 -m venv "$venv" &&
      grep -vE '^(e2b==|-c )' "$here/python/requirements.txt" >"$d/req.txt" &&
      "$venv/bin/pip" install -q --disable-pip-version-check -r "$d/req.txt" "$spec"; } >&2 \
      || { echo "compat-tests: pip install $spec failed" >&2; total_fail=$((total_fail + 1)); return; }
  fi
  ver=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("e2b"))' 2>/dev/null)
  echo "=== [$mode] Python suite: e2b==$ver ($("$venv/bin/python" --version))"
  (cd "$here/python" && "${runner[@]}" env "${mode_env[@]}" timeout --kill-after=10 1200 "$venv/bin/python" -m pytest -p no:cacheprovider -rfE ${COMPAT_PY_ARGS:-}) 2>&1 | tee "$out"
  local last p f e
  last=$(grep -aE '^=+ .* in [0-9.]+s' "$out" | tail -n1)
  p=$(grep -oE '[0-9]+ passed' <<<"$last" | grep -oE '[0-9]+'); f=$(grep -oE '[0-9]+ failed' <<<"$last" | grep -oE '[0-9]+')
  e=$(grep -oE '[0-9]+ errors?' <<<"$last" | grep -oE '[0-9]+')
  p=${p:-0}; f=${f:-0}; e=${e:-0}
  if [[ -z $last ]]; then
    echo "compat-tests: pytest printed no summary" >&2; f=$((f + 1))
  fi
  echo "[$mode] Python: $p passed, $((f + e)) failed"
  summary+=("[$mode] Python: $p passed, $((f + e)) failed")
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f + e)); ran_any=$((ran_any + p + f + e))
}

# wait_code_interpreter: waits (at most 20 min) until the code-interpreter-v1
# template that sandboxd builds at start is ready, or its build failed.
wait_code_interpreter() {
  echo "compat-tests: waiting for sandboxd's code-interpreter-v1 build (pip from PyPI, Deno from npm)"
  SSL_CERT_FILE=$sbxd_ca python3 - "$sbxd_url/v1/sandboxes/e2b" "$sbxd_key" <<'EOF2'
import json, sys, time, urllib.request
api, key = sys.argv[1], sys.argv[2]
start = time.monotonic()
while time.monotonic() - start < 1200:
    req = urllib.request.Request(api + "/templates", headers={"X-API-Key": key})
    with urllib.request.urlopen(req, timeout=30) as r:
        st = next((t["buildStatus"] for t in json.load(r) if "code-interpreter-v1" in (t.get("aliases") or [])), "")
    if st in ("ready", "error"):
        print(f"compat-tests: code-interpreter-v1 {st} after {time.monotonic() - start:.0f} s")
        break
    time.sleep(2)
EOF2
}

run_suites() { # run_suites MODE
  for s in $suites; do
    case $s in
      js) run_js "$1" ;;
      py|python) run_py "$1" ;;
      *) echo "compat-tests: unknown suite '$s'" >&2; total_fail=$((total_fail + 1)) ;;
    esac
  done
}

# --- debug mode: the SDKs' debug mode against bin/envd on :49983 -------------
run_debug() {
  # Fail fast if something already serves the port: the SDKs in debug mode can
  # only reach localhost:49983, and testing someone else's server proves nothing.
  if port_taken $port; then
    echo "compat-tests: 127.0.0.1:$port is already in use; stop whatever listens there (ss -ltnp 'sport = :$port')" >&2
    total_fail=$((total_fail + 1)); return
  fi
  local envd_port=$port
  if [[ ${COMPAT_WIRELOG:-} == 1 ]]; then
    envd_port=$((port + 1))
    if port_taken $envd_port; then echo "compat-tests: 127.0.0.1:$envd_port is already in use" >&2; total_fail=$((total_fail + 1)); return; fi
  fi
  "$envd_bin" --listen "127.0.0.1:$envd_port" --log-level debug >"$log_dir/envd.log" 2>&1 &
  envd_pid=$!
  if [[ ${COMPAT_WIRELOG:-} == 1 ]]; then
    python3 "$here/wirelog.py" "$port" "$envd_port" "$log_dir/wire.log" &
    proxy_pid=$!
  fi
  local up=
  for _ in $(seq 1 100); do
    kill -0 "$envd_pid" 2>/dev/null || break
    http_ok $port /health 2>/dev/null && { up=1; break; }
    sleep 0.1
  done
  if [[ -z $up ]]; then
    cat "$log_dir/envd.log" >&2
    echo "compat-tests: envd did not answer GET /health within 10 s" >&2
    total_fail=$((total_fail + 1))
  else
    echo "compat-tests: [debug] $(basename "$envd_bin") $("$envd_bin" --version) on 127.0.0.1:$envd_port (log: $log_dir/envd.log)"
    [[ -n $proxy_pid ]] && echo "compat-tests: wire log of 127.0.0.1:$port in $log_dir/wire.log"
    # COMPAT_ENVD: for the tests that start their own envd (secure.test.mjs,
    # test_secure.py).
    # Their ports are picked free here (other runs may share the machine).
    mode_env=(-u E2B_API_URL -u E2B_SANDBOX_URL -u COMPAT_INET_ONE -u COMPAT_INET_TWO COMPAT_TARGET=debug E2B_DEBUG=true
      "COMPAT_ENVD=$envd_bin" "COMPAT_LOG_DIR=$log_dir" "E2B_API_KEY=e2b_$(printf '0%.0s' {1..40})"
      "COMPAT_SECURE_PORT=${COMPAT_SECURE_PORT:-$(free_port)}" "COMPAT_SECURE_PY_PORT=${COMPAT_SECURE_PY_PORT:-$(free_port)}")
    run_suites debug
    if ! kill -0 "$envd_pid" 2>/dev/null; then
      echo "compat-tests: envd died during the run (see $log_dir/envd.log)" >&2
      total_fail=$((total_fail + 1))
    fi
  fi
  [[ -n $proxy_pid ]] && stop "$proxy_pid"
  stop "$envd_pid"
  envd_pid= proxy_pid=
}

# --- sandboxd mode: the SDKs against a real sandboxd -------------------------

# start_sandboxd DATA_DIR: serves on $sbxd_port with run dir $sbxd_run; waits
# for GET /health (sandboxd has reconciled).
start_sandboxd() {
  # --domain (sbxd_domain): in the sandboxd and incus modes a reserved TLD
  # that never resolves, so getHost() is `<port>-<id>.sandboxd.test` (tested
  # by sending it as Host to sandboxd), and nothing can fall back to E2B's
  # default domain e2b.app.
  # --metrics-interval 1s: the metrics history tests see samples in seconds.
  # setsid: a Ctrl-C on the terminal must not stop sandboxd before the leak
  # check has killed the sandboxes through it.
  setsid "$sandboxd_bin" serve --listen "127.0.0.1:$sbxd_port" --data-dir "$1" --run-dir "$sbxd_run" \
    --envd "$envd_bin" --domain "$sbxd_domain" --metrics-interval 1s "${sbxd_args[@]}" ${COMPAT_SERVE_ARGS:-} >>"$log_dir/sandboxd.log" 2>&1 &
  sbxd_pid=$!
  for _ in $(seq 1 300); do
    kill -0 "$sbxd_pid" 2>/dev/null || return 1
    sbxd_up && return 0
    sleep 0.1
  done
  return 1
}

# reap_sandboxes: lists every sandbox of the run's tenant (all pages, running
# and paused), kills each through the API and prints one line per leak.
reap_sandboxes() {
  SSL_CERT_FILE=$sbxd_ca python3 - "$sbxd_url/v1/sandboxes/e2b" "$sbxd_key" <<'EOF'
import json, sys, urllib.request, urllib.error, urllib.parse
base, key = sys.argv[1:]
def call(method, path):
    req = urllib.request.Request(base + path, method=method, headers={"X-API-KEY": key})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.headers.get("x-next-token"), r.read()
ids, token = [], None
while True:
    q = {"state": "running,paused", "limit": "100"}
    if token:
        q["nextToken"] = token
    status, token, body = call("GET", "/v2/sandboxes?" + urllib.parse.urlencode(q))
    ids += [(s["sandboxID"], s.get("state"), s.get("metadata") or {}) for s in json.loads(body)]
    if not token:
        break
for sid, state, md in ids:
    try:
        status, _, _ = call("DELETE", f"/sandboxes/{sid}")
    except urllib.error.HTTPError as e:
        status = e.code
    print(f"leaked sandbox {sid} ({state}, metadata {json.dumps(md)}): DELETE -> {status}")
EOF
}

# start_registry: the template suites' image (compat-tests/registry) in two
# registries on loopback, one open and one behind basic auth; sets reg_env
# for the suites and adds --plain-http-registries to sbxd_args.
start_registry() {
  local bin open private
  bin=$(mktemp -d -t compat-registry.XXXXXX); tmp_dirs+=("$bin")
  if ! (cd "$root" && go build -o "$bin/registry" ./compat-tests/registry) >>"$log_dir/registry.log" 2>&1; then
    echo "compat-tests: building compat-tests/registry failed (see $log_dir/registry.log)" >&2; return 1
  fi
  open=127.0.0.1:$(free_port); private=127.0.0.1:$(free_port)
  "$bin/registry" --open "$open" --private "$private" --user compat --pass compat-secret >"$log_dir/registry.log" 2>&1 &
  reg_pid=$!
  for _ in $(seq 1 100); do
    grep -q '^ready' "$log_dir/registry.log" 2>/dev/null && break
    kill -0 "$reg_pid" 2>/dev/null || break
    sleep 0.1
  done
  grep -q '^ready' "$log_dir/registry.log" || { cat "$log_dir/registry.log" >&2; echo "compat-tests: the test registry did not start" >&2; return 1; }
  sbxd_args+=("--plain-http-registries=$open,$private")
  reg_env=("COMPAT_REGISTRY=$open" "COMPAT_PRIVATE_REGISTRY=$private" COMPAT_REGISTRY_USER=compat COMPAT_REGISTRY_PASS=compat-secret)
}

# start_fakeinet: the fake internet (compat-tests/fakeinet, a network
# namespace with servers ONE and TWO); sets inet_env for the suites and adds
# --egress-dns=ONE to sbxd_args. It removes its namespace and veth on
# SIGTERM (stop), and what a killed one left at its next start.
start_fakeinet() {
  local bin log=$log_dir/fakeinet.log one two
  bin=$(mktemp -d -t compat-fakeinet.XXXXXX); tmp_dirs+=("$bin")
  inet_env=()
  if ! (cd "$root" && go build -o "$bin/fakeinet" ./compat-tests/fakeinet) >>"$log" 2>&1; then
    echo "compat-tests: building compat-tests/fakeinet failed (see $log)" >&2; return 1
  fi
  "$bin/fakeinet" >"$log" 2>&1 &
  inet_pid=$!
  for _ in $(seq 1 100); do
    grep -q '^ready' "$log" 2>/dev/null && break
    kill -0 "$inet_pid" 2>/dev/null || break
    sleep 0.1
  done
  one=$(sed -n 's/^COMPAT_INET_ONE=//p' "$log"); two=$(sed -n 's/^COMPAT_INET_TWO=//p' "$log")
  if ! grep -q '^ready' "$log" || [[ -z $one || -z $two ]]; then
    cat "$log" >&2; echo "compat-tests: the fake internet did not start: the network tests will skip" >&2
    stop "$inet_pid"; inet_pid=
    return 1
  fi
  echo "compat-tests: fake internet: ONE $one, TWO $two (log: $log)"
  sbxd_args+=("--egress-dns=$one")
  inet_env=("COMPAT_INET_ONE=$one" "COMPAT_INET_TWO=$two")
}

run_sandboxd() { # run_sandboxd MODE: sandboxd or domain (local backend), incus or cluster
  local mode=$1 data out left before= layers_before= mode_backend=local
  mode_backend_cli=$mode
  if [[ $mode == cluster ]]; then
    # The Incus backend on the three-member test cluster, through its
    # relays; the network is the members' (their relays' firewall), so no
    # --egress-* here and no fake internet (the network suites skip).
    mode_backend=incus
    # shellcheck disable=SC1090 # the cluster's env file
    source "$cluster_env"
    sbxd_args=(--backend incus --incus-remote "$SANDBOXD_INCUS_URL" --incus-client-cert "$SANDBOXD_INCUS_CLIENT_CERT"
      --incus-client-key "$SANDBOXD_INCUS_CLIENT_KEY" --incus-server-cert "$SANDBOXD_INCUS_SERVER_CERT" --incus-simple-quotas)
    before=$(incus_instances) || { echo "compat-tests: [cluster] cannot list the cluster's instances" >&2; total_fail=$((total_fail + 1)); return; }
    # Volumes answer 501 on a remote Incus (incus/README.md): their tests skip.
    export COMPAT_NO_VOLUMES=1
    layers_before=$(incus_layers)
  elif [[ $mode == incus ]]; then
    mode_backend=incus
    unset COMPAT_NO_VOLUMES
    # --egress-subnet: one outside the Incus backend's default 10.134.0.0/16
    # (whose random /24s the incus package's tests pick), so both can run
    # at once. Outside it, not a /24 of it: the rules of a sandboxd on the
    # default subnet (running, or left after it: they outlive sandboxd)
    # drop whatever their own --egress-allow-cidr does not list for every
    # address in it, the code-interpreter build's PyPI too.
    sbxd_args=(--backend incus --egress-subnet 10.199.0.0/24)
    before=$(incus_instances) || { echo "compat-tests: [incus] cannot list Incus instances" >&2; total_fail=$((total_fail + 1)); return; }
    layers_before=$(incus_layers)
  else
    sbxd_args=()
    unset COMPAT_NO_JS_KERNEL COMPAT_NO_VOLUMES
  fi
  # The code-interpreter template's build pip-installs from PyPI and
  # npm-installs Deno from the registry npm is configured with here. Where
  # they resolve to a mirror on an address sandboxes may not reach by
  # default (private or special-purpose), open that address, else the build
  # would retry for many minutes and the tests wait for it. The local
  # backend gets a subnet of its own: the allowance lives in the subnet's
  # nftables table, which any other sandboxd on the default subnet (a test
  # run on this host) rewrites without it; the incus mode's /24 is its own
  # already.
  local pypi npm_host
  npm_host=$(npm config get registry 2>/dev/null | sed -E 's#^[a-z]+://([^/:]+).*#\1#')
  pypi=$(python3 - "$npm_host" <<'EOF2' 2>/dev/null
import ipaddress, socket, sys
hosts = ["pypi.org", "files.pythonhosted.org"] + [h for h in sys.argv[1:] if h]
ips = set()
for h in hosts:
    try:
        ips |= {a[4][0] for a in socket.getaddrinfo(h, 443, socket.AF_INET)}
    except OSError:
        pass
print(",".join(sorted(i + "/32" for i in ips if not ipaddress.ip_address(i).is_global)))
EOF2
)
  if [[ $mode == cluster ]]; then
    # This build's envd and relay on every member; the relays' firewall
    # gets the allowance (the members' network is theirs).
    [[ -n $pypi ]] && echo "compat-tests: [cluster] PyPI or npm's registry resolves to $pypi here: the members' relays get --egress-allow-cidr for the code-interpreter build"
    if ! out=$(RELAY_EGRESS_ALLOW=$pypi SANDBOXD_BIN=$(dirname "$sandboxd_bin") SANDBOXD_AGENT=$envd_bin "$root/scripts/incus-cluster.sh" push 2>&1); then
      echo "$out" >&2; echo "compat-tests: [cluster] incus-cluster.sh push failed" >&2
      total_fail=$((total_fail + 1)); return
    fi
  elif [[ -n $pypi ]]; then
    echo "compat-tests: PyPI or npm's registry resolves to $pypi here: sandboxd gets --egress-allow-cidr for the code-interpreter build"
    sbxd_args+=("--egress-allow-cidr=$pypi")
    [[ $mode != incus ]] && sbxd_args+=(--egress-subnet "${COMPAT_EGRESS_SUBNET:-10.198.0.0/16}")
  fi
  start_registry || { total_fail=$((total_fail + 1)); return; }
  if [[ $mode != cluster ]]; then
    start_fakeinet || total_fail=$((total_fail + 1))
  fi
  data=$(mktemp -d -t compat-sandboxd.XXXXXX); tmp_dirs+=("$data")
  sbxd_run=/run/sandboxd/compat-$mode-$(date +%s)-$$-$RANDOM
  sbxd_port=$(free_port)
  sbxd_domain=sandboxd.test sbxd_url=http://127.0.0.1:$sbxd_port sbxd_ca= runner=()
  if [[ $mode == domain ]]; then
    sbxd_domain=sandboxd.localhost:$sbxd_port sbxd_url=https://127.0.0.1:$sbxd_port sbxd_ca=$data/tls/ca.pem
    if ! "$sandboxd_bin" tls init --domain sandboxd.localhost --dir "$data/tls" >>"$log_dir/sandboxd.log" 2>&1; then
      echo "compat-tests: sandboxd tls init failed (see $log_dir/sandboxd.log)" >&2
      total_fail=$((total_fail + 1)); return
    fi
    sbxd_args+=(--tls-cert "$data/tls/cert.pem" --tls-key "$data/tls/key.pem")
    # The host's nsswitch.conf with myhostname after files, bind-mounted over
    # it in the runners' own mount namespace (unshare's default propagation
    # is private: the host never sees the mount).
    sed -E '/^hosts:/{/myhostname/!s/\<files\>/files myhostname/}' /etc/nsswitch.conf >"$data/nsswitch.conf"
    grep -q '^hosts:.*myhostname' "$data/nsswitch.conf" || echo 'hosts: files myhostname dns' >>"$data/nsswitch.conf"
    runner=(unshare --mount -- sh -c 'mount --bind "$0" /etc/nsswitch.conf && exec "$@"' "$data/nsswitch.conf")
  fi
  if ! sbxd_key=$("$sandboxd_bin" keys create --data-dir "$data" --tenant compat 2>>"$log_dir/sandboxd.log"); then
    echo "compat-tests: sandboxd keys create failed (see $log_dir/sandboxd.log)" >&2
    total_fail=$((total_fail + 1)); return
  fi
  # A second tenant's key, for the suites' cross-tenant checks (volumes).
  sbxd_key2=$("$sandboxd_bin" keys create --data-dir "$data" --tenant compat-other 2>>"$log_dir/sandboxd.log") || sbxd_key2=
  # Tenants with small volume quotas, for the suites' quota checks: two
  # volumes (compat-quota), 40 MiB in all (compat-quota-mb), 16 MiB each.
  quota_keys=()
  for q in "compat-quota --max-volumes 2" "compat-quota-mb --max-volumes 0 --max-volumes-mb 40"; do
    # shellcheck disable=SC2086 # q is the tenant and its flags
    "$sandboxd_bin" tenants set $q --volume-size-mb 16 --data-dir "$data" >>"$log_dir/sandboxd.log" 2>&1 &&
      quota_keys+=("$("$sandboxd_bin" keys create --data-dir "$data" --tenant "${q%% *}" 2>>"$log_dir/sandboxd.log")") || quota_keys+=("")
  done
  # A native-API JWT of tenant compat with sandboxes:read only, for the MCP
  # scope checks (test_mcp.py).
  sbxd_read_token=$("$sandboxd_bin" token create --data-dir "$data" --tenant compat --scope sandboxes:read --ttl 3h \
    2>>"$log_dir/sandboxd.log") || sbxd_read_token=
  if ! start_sandboxd "$data"; then
    tail -n 30 "$log_dir/sandboxd.log" >&2
    echo "compat-tests: sandboxd did not answer GET /health within 30 s" >&2
    total_fail=$((total_fail + 1))
  else
    echo "compat-tests: [$mode] sandboxd $("$sandboxd_bin" version 2>&1 | head -n1) on $sbxd_url, agent $envd_bin, --domain $sbxd_domain, run dir $sbxd_run (log: $log_dir/sandboxd.log)"
    mode_env=(-u E2B_DEBUG -u COMPAT_INET_ONE -u COMPAT_INET_TWO COMPAT_TARGET=sandboxd "COMPAT_BACKEND=$mode_backend" "COMPAT_LOG_DIR=$log_dir" E2B_DOMAIN=sandboxd.test
      "E2B_API_URL=http://127.0.0.1:$sbxd_port/v1/sandboxes/e2b"
      "E2B_VOLUME_API_URL=http://127.0.0.1:$sbxd_port/v1/sandboxes/e2b" "COMPAT_OTHER_API_KEY=$sbxd_key2"
      "COMPAT_QUOTA_API_KEY=${quota_keys[0]}" "COMPAT_QUOTA_MB_API_KEY=${quota_keys[1]}"
      "COMPAT_READ_TOKEN=$sbxd_read_token" "E2B_SANDBOX_URL=http://127.0.0.1:$sbxd_port" "E2B_API_KEY=$sbxd_key" "${reg_env[@]}" "${inet_env[@]}")
    if [[ $mode == domain ]]; then
      mode_env=(-u E2B_DEBUG -u COMPAT_INET_ONE -u COMPAT_INET_TWO -u E2B_API_URL -u E2B_SANDBOX_URL -u E2B_VOLUME_API_URL
        COMPAT_TARGET=sandboxd COMPAT_ADDRESSING=domain COMPAT_BACKEND=local "COMPAT_LOG_DIR=$log_dir"
        "E2B_DOMAIN=$sbxd_domain" "SSL_CERT_FILE=$sbxd_ca" "NODE_EXTRA_CA_CERTS=$sbxd_ca"
        "COMPAT_OTHER_API_KEY=$sbxd_key2" "COMPAT_QUOTA_API_KEY=${quota_keys[0]}" "COMPAT_QUOTA_MB_API_KEY=${quota_keys[1]}"
        "COMPAT_READ_TOKEN=$sbxd_read_token" "E2B_API_KEY=$sbxd_key" "${reg_env[@]}" "${inet_env[@]}")
    fi
    run_suites "$mode"
    if ! kill -0 "$sbxd_pid" 2>/dev/null; then
      echo "compat-tests: sandboxd died during the run (see $log_dir/sandboxd.log)" >&2
      total_fail=$((total_fail + 1))
    fi
  fi
  # Leaks: every sandbox still listed is one a test did not kill.
  if kill -0 "$sbxd_pid" 2>/dev/null; then
    if ! out=$(reap_sandboxes 2>&1); then
      echo "compat-tests: listing sandboxes failed: $out" >&2; total_fail=$((total_fail + 1))
    elif [[ -n $out ]]; then
      echo "$out" | sed 's/^/compat-tests: /' >&2
      local n; n=$(grep -c '^leaked' <<<"$out")
      total_fail=$((total_fail + n))
      summary+=("[$mode] leaks: $n sandbox(es) still listed after the suites")
    fi
  fi
  # SIGTERM, SIGKILL only after 10 s; on Incus 40: sandboxd waits up to 30 s
  # there for its background deletions (the drained pools' members: 25 of
  # them on the test cluster took longer than 10 s); on the cluster 150: a
  # template replica's copy in flight cannot be cancelled, and sandboxd
  # waits up to 2 min for it to delete its half-made instance.
  local grace=10
  [[ $mode == incus ]] && grace=40
  [[ $mode == cluster ]] && grace=150
  stop "$sbxd_pid" "$grace"
  sbxd_pid=
  left=$(ls -A "$sbxd_run/sandboxes" 2>/dev/null)
  if [[ -n $left ]]; then
    echo "compat-tests: $sbxd_run/sandboxes is not empty after sandboxd stopped: $(echo $left)" >&2
    total_fail=$((total_fail + 1))
    summary+=("[$mode] leaks: $sbxd_run/sandboxes not empty after SIGTERM")
    # Sandboxes outlive sandboxd: start it once more on the same state so it
    # re-adopts them, kill them through the API, stop it again.
    if start_sandboxd "$data"; then reap_sandboxes >&2; fi
    stop "$sbxd_pid"; sbxd_pid=
  fi
  remove_run_dir
  stop "$reg_pid"; reg_pid=
  [[ -n $inet_pid ]] && stop "$inet_pid"
  inet_pid= inet_env=()
  if [[ $mode == incus || $mode == cluster ]]; then
    # Destroy deletes in the background; sandboxd waits for those deletions
    # at SIGTERM, so every instance made during the run must be gone now.
    local after new
    if ! after=$(incus_instances); then
      echo "compat-tests: [incus] cannot list Incus instances" >&2; total_fail=$((total_fail + 1))
    else
      new=$(comm -13 <(echo "$before") <(echo "$after"))
      if [[ -n $new ]]; then
        echo "compat-tests: [$mode] Incus instances left after sandboxd stopped: $(echo $new)" >&2
        total_fail=$((total_fail + $(wc -l <<<"$new")))
        summary+=("[$mode] leaks: $(wc -l <<<"$new") Incus instance(s) left")
      fi
    fi
    # The run's templates lived in its throw-away data dir; their layer
    # instances (and, on a cluster, the layers' replicas on the other
    # members) would stay on the pools run after run.
    local l
    for l in $(comm -13 <(echo "$layers_before") <(incus_layers)); do incus_cli delete "$l" >/dev/null 2>&1; done
  fi
}

# incus_instances: the names of the Incus instances a sandboxd without a
# namespace could have made (tests of the incus package use namespaces),
# but for finished template layers and the cluster test bed's members
# (sbdc-*, scripts/incus-cluster.sh, which may come up or restart a member
# while this mode runs), sorted, one a line.
# incus_layers: the finished template layers (stopped sbl-* instances with
# user.sandboxd.layer) such a sandboxd has now, and their replicas on a
# cluster's other members (sbr-* with user.sandboxd.replica-of).
incus_instances() { incus_list 'not i["name"].startswith(("sbl-", "sbr-", "sbdc-"))'; }
incus_layers() { incus_list '(i["name"].startswith("sbl-") and "user.sandboxd.layer" in i["config"]) or (i["name"].startswith("sbr-") and "user.sandboxd.replica-of" in i["config"])'; }
incus_list() {
  incus_cli query '/1.0/instances?recursion=1' | python3 -c '
import json, sys
print("\n".join(sorted(i["name"] for i in json.load(sys.stdin)
                        if not i["config"].get("user.sandboxd.namespace") and ('"$1"'))))'
}


# remove_run_dir: removes the run dir if no sandbox is left in it and nothing
# is mounted below it.
remove_run_dir() {
  if [[ -d $sbxd_run && -z $(ls -A "$sbxd_run/sandboxes" 2>/dev/null) ]] && ! grep -qF " $sbxd_run" /proc/self/mountinfo; then
    rm -rf --one-file-system "$sbxd_run"
  fi
}

for t in $targets; do
  case $t in
    debug) run_debug ;;
    sandboxd) run_sandboxd sandboxd ;;
    incus) run_sandboxd incus ;;
    cluster) run_sandboxd cluster ;;
    domain) run_sandboxd domain ;;
  esac
done

echo "compat-tests: logs in $log_dir"
for l in "${summary[@]}"; do echo "compat-tests: $l"; done
echo "compat-tests: took $((SECONDS - started_at)) s"
if ((ran_any == 0)); then
  echo "compat-tests: no test ran" >&2
  total_fail=$((total_fail + 1))
fi
echo "$total_pass passed, $total_fail failed"
((total_fail == 0))
