#!/usr/bin/env bash
# Runs E2B's real SDKs (JS `e2b` from npm, Python `e2b` from PyPI) against
# bin/envd in the SDKs' debug mode, then prints ONE closing line
# `N passed, N failed` (both suites together). Exits non-zero if anything
# failed or if no test ran. See compat-tests/README.md.
#
# Environment:
#   E2B_SDK_VERSION=latest    test the newest SDKs instead of the pinned ones
#                             (installed into a temporary directory; the
#                             pinned lock files are left alone)
#   E2B_JS_SDK_VERSION=X      the same for the JS SDK only (npm version/tag)
#   E2B_PY_SDK_VERSION=X      the same for the Python SDK only (PyPI version,
#                             or `latest`)
#   COMPAT_SUITES="js py"     which suites to run (default both)
#   COMPAT_LOG_DIR=DIR        where envd.log and the runners' output go
#                             (default: a fresh temp dir, printed at the end)
#   COMPAT_ENVD=PATH          envd binary (default bin/envd)
#   COMPAT_JS_TESTS="a b"     JS test files to run, relative to js/test
#                             (default: all *.test.mjs)
#   COMPAT_PY_ARGS="..."      extra pytest arguments, e.g. "-k watch -x"
#   COMPAT_WIRELOG=1          put envd on 127.0.0.1:49984 behind wirelog.py on
#                             :49983 and log all traffic to $COMPAT_LOG_DIR/wire.log
set -uo pipefail

cd "$(dirname "$0")/.."
root=$PWD
here=$root/compat-tests
port=49983
envd_bin=${COMPAT_ENVD:-$root/bin/envd}
suites=${COMPAT_SUITES:-js py}
log_dir=${COMPAT_LOG_DIR:-$(mktemp -d -t compat-tests.XXXXXX)}
mkdir -p "$log_dir"
js_ver=${E2B_JS_SDK_VERSION:-${E2B_SDK_VERSION:-}}
py_ver=${E2B_PY_SDK_VERSION:-${E2B_SDK_VERSION:-}}

die() { echo "compat-tests: $*" >&2; echo "0 passed, 1 failed"; exit 1; }

[[ -x $envd_bin ]] || die "$envd_bin is missing: run 'make build' first"

# Dependencies: scripts/ci-deps.sh is idempotent, so a fresh clone works too.
if [[ -z $js_ver && ! -d $here/js/node_modules/e2b ]] || [[ -z $py_ver && ! -x $here/python/.venv/bin/pytest ]]; then
  "$root/scripts/ci-deps.sh" || die "installing dependencies failed"
fi

# The E2B templates' default user; envd runs commands as it unless told otherwise.
if ! id user >/dev/null 2>&1; then
  useradd -m -s /bin/bash user || die "cannot create user 'user' (run as root)"
fi

# Fail fast if something already serves the port: the SDKs in debug mode can
# only reach localhost:49983, and testing someone else's server proves nothing.
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  die "127.0.0.1:$port is already in use; stop whatever listens there (ss -ltnp 'sport = :$port')"
fi

# Start envd. umask 022 so created files get the modes E2B templates give them.
umask 022
envd_port=$port
if [[ ${COMPAT_WIRELOG:-} == 1 ]]; then
  envd_port=$((port + 1))
  if (exec 3<>"/dev/tcp/127.0.0.1/$envd_port") 2>/dev/null; then die "127.0.0.1:$envd_port is already in use"; fi
fi
"$envd_bin" --listen "127.0.0.1:$envd_port" --log-level debug >"$log_dir/envd.log" 2>&1 &
envd_pid=$!
proxy_pid=
if [[ ${COMPAT_WIRELOG:-} == 1 ]]; then
  python3 "$here/wirelog.py" "$port" "$envd_port" "$log_dir/wire.log" &
  proxy_pid=$!
fi
tmp_dirs=()
stop() { # stop PID: SIGTERM, then SIGKILL after 10 s
  if kill "$1" 2>/dev/null; then
    for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$1" 2>/dev/null
  fi
  wait "$1" 2>/dev/null
}
cleanup() {
  [[ -n $proxy_pid ]] && stop "$proxy_pid"
  stop "$envd_pid"
  for d in "${tmp_dirs[@]}"; do rm -rf "$d"; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

health() {
  local line
  exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
  printf 'GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' >&3
  IFS= read -r -t 2 line <&3
  exec 3<&-
  [[ $line =~ ^HTTP/1\.[01]\ 2[0-9][0-9] ]]
}
for _ in $(seq 1 100); do
  kill -0 "$envd_pid" 2>/dev/null || { cat "$log_dir/envd.log" >&2; die "envd exited during startup"; }
  health 2>/dev/null && break
  sleep 0.1
done
health 2>/dev/null || { cat "$log_dir/envd.log" >&2; die "envd did not answer GET /health within 10 s"; }
echo "compat-tests: envd $("$envd_bin" --version) on 127.0.0.1:$envd_port (log: $log_dir/envd.log)"
[[ -n $proxy_pid ]] && echo "compat-tests: wire log of 127.0.0.1:$port in $log_dir/wire.log"

export E2B_DEBUG=true
# For the tests that start their own envd (secure.test.mjs, test_secure.py).
export COMPAT_ENVD=$envd_bin COMPAT_LOG_DIR=$log_dir
export E2B_API_KEY=${E2B_API_KEY:-e2b_$(printf '0%.0s' {1..40})}

total_pass=0
total_fail=0
ran_any=0

# count FILE REGEX: the first capture group of the last matching line, or 0.
count() { grep -aoE "$2" "$1" | tail -n1 | grep -oE '[0-9]+' | head -n1 || true; }

run_js() {
  local dir=$here/js out=$log_dir/js.tap ver
  if [[ -n $js_ver ]]; then
    dir=$(mktemp -d -t compat-js.XXXXXX); tmp_dirs+=("$dir")
    cp -r "$here/js/test" "$dir/"
    printf '{"name":"compat-js-latest","private":true,"type":"module"}\n' >"$dir/package.json"
    (cd "$dir" && npm install --no-audit --no-fund --loglevel=error "e2b@$js_ver") >&2 \
      || { echo "compat-tests: npm install e2b@$js_ver failed" >&2; total_fail=$((total_fail + 1)); return; }
  fi
  ver=$(node -p "require('$dir/node_modules/e2b/package.json').version" 2>/dev/null)
  local js_files=test/*.test.mjs
  if [[ -n ${COMPAT_JS_TESTS:-} ]]; then js_files=$(printf 'test/%s ' $COMPAT_JS_TESTS); fi
  echo "=== JS suite: e2b@$ver (node $(node --version))"
  (cd "$dir" && timeout --kill-after=10 1200 node --test --test-reporter=tap --test-concurrency=1 \
    --test-timeout=90000 $js_files) 2>&1 | tee "$out"
  local p f c
  p=$(count "$out" '^# pass [0-9]+'); f=$(count "$out" '^# fail [0-9]+'); c=$(count "$out" '^# cancelled [0-9]+')
  p=${p:-0}; f=${f:-0}; c=${c:-0}
  if ! grep -aqE '^# pass [0-9]+' "$out"; then
    echo "compat-tests: the JS runner printed no summary" >&2; f=$((f + 1))
  fi
  echo "JS: $p passed, $((f + c)) failed"
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f + c)); ran_any=$((ran_any + p + f + c))
}

run_py() {
  local venv=$here/python/.venv out=$log_dir/py.txt ver
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
  echo "=== Python suite: e2b==$ver ($("$venv/bin/python" --version))"
  (cd "$here/python" && timeout --kill-after=10 1200 "$venv/bin/python" -m pytest -p no:cacheprovider -rfE ${COMPAT_PY_ARGS:-}) 2>&1 | tee "$out"
  local last p f e
  last=$(grep -aE '^=+ .* in [0-9.]+s' "$out" | tail -n1)
  p=$(grep -oE '[0-9]+ passed' <<<"$last" | grep -oE '[0-9]+'); f=$(grep -oE '[0-9]+ failed' <<<"$last" | grep -oE '[0-9]+')
  e=$(grep -oE '[0-9]+ errors?' <<<"$last" | grep -oE '[0-9]+')
  p=${p:-0}; f=${f:-0}; e=${e:-0}
  if [[ -z $last ]]; then
    echo "compat-tests: pytest printed no summary" >&2; f=$((f + 1))
  fi
  echo "Python: $p passed, $((f + e)) failed"
  total_pass=$((total_pass + p)); total_fail=$((total_fail + f + e)); ran_any=$((ran_any + p + f + e))
}

for s in $suites; do
  case $s in
    js) run_js ;;
    py|python) run_py ;;
    *) echo "compat-tests: unknown suite '$s'" >&2; total_fail=$((total_fail + 1)) ;;
  esac
done

if ! kill -0 "$envd_pid" 2>/dev/null; then
  echo "compat-tests: envd died during the run (see $log_dir/envd.log)" >&2
  total_fail=$((total_fail + 1))
fi
echo "compat-tests: logs in $log_dir"
if ((ran_any == 0)); then
  echo "compat-tests: no test ran" >&2
  total_fail=$((total_fail + 1))
fi
echo "$total_pass passed, $total_fail failed"
((total_fail == 0))
