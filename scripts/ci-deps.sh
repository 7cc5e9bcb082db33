#!/usr/bin/env bash
# Installs what `make test` needs beyond what a fresh Debian 12 machine with
# Go, Node 20 + npm and Python 3.11 already has. Idempotent and quick when
# nothing changed: each step is skipped when its inputs are unchanged.
#   - Debian packages (apt-get update runs once, only if something is missing):
#     gcc + libc6-dev for `go test -race` (cgo), libseccomp-dev, pkg-config,
#     nftables and iproute2 for the local backend, python3-venv when the Python
#     has no ensurepip, passwd for useradd, coreutils/procps for the tests.
#   - compat-tests/js: `npm ci` from the committed package-lock.json.
#   - compat-tests/python/.venv: pip install -r requirements.txt (pinned with
#     constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "ci-deps: $*"; }

# --- Debian packages ---------------------------------------------------------
need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc)
[[ -e /usr/include/stdio.h ]] || need+=(libc6-dev)
command -v useradd >/dev/null 2>&1 || need+=(passwd)
command -v timeout >/dev/null 2>&1 || need+=(coreutils)
command -v ps >/dev/null 2>&1 || need+=(procps)
# The local backend (runtime/local/DEPS.md): libseccomp for `-tags seccomp`,
# nftables and iproute2 for sandboxes with internet egress.
[[ -e /usr/include/seccomp.h ]] || need+=(libseccomp-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
if ((${#need[@]})); then
  [[ $(id -u) == 0 ]] || { log "need root to apt-get install ${need[*]}"; exit 1; }
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# A stamp of the inputs, kept inside what it describes, so a changed lock file
# or a deleted install directory re-runs the step.
stamp_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

# --- JS compat suite -----------------------------------------------------------
js=compat-tests/js
want=$(stamp_of "$js/package-lock.json" <(node --version))
if [[ $(cat "$js/node_modules/.ci-deps-stamp" 2>/dev/null) != "$want" ]]; then
  log "npm ci in $js"
  (cd "$js" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$want" >"$js/node_modules/.ci-deps-stamp"
fi

# --- Python compat suite -------------------------------------------------------
py=compat-tests/python
want=$(stamp_of "$py/requirements.txt" "$py/constraints.txt" <(python3 --version))
if [[ $(cat "$py/.venv/.ci-deps-stamp" 2>/dev/null) != "$want" ]]; then
  log "python venv + pip install in $py/.venv"
  rm -rf "$py/.venv"
  python3 -m venv "$py/.venv"
  "$py/.venv/bin/pip" install -q --disable-pip-version-check -r "$py/requirements.txt"
  echo "$want" >"$py/.venv/.ci-deps-stamp"
fi
log "ok"
