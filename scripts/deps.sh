#!/usr/bin/env bash
# Installs what this repo needs beyond Go, Node 20 + npm and Python 3.11 on a
# fresh Debian 12 machine. Idempotent, and a no-op in a fraction of a second
# when everything is there: each step checks for what it installs first.
#
#   deps.sh build   what `make build` needs, and the local backend at run
#                   time (runtime/local/DEPS.md): gcc + libc6-dev for cgo and
#                   the static sandboxd-init, libseccomp-dev + pkg-config for
#                   -tags seccomp, nftables and iproute2 for sandboxes with
#                   internet egress, debootstrap for the base root
#                   filesystem (scripts/base-rootfs.sh). `make build` (so
#                   `make run`) calls this.
#   deps.sh schema  only schemathesis's venv (below); scripts/schemathesis.sh
#                   calls this.
#   deps.sh         (all) the above, plus what `make test` and `make bench`
#                   need: passwd (useradd), coreutils and procps for the
#                   tests, python3-venv where Python has no ensurepip, and
#                   bubblewrap (the floor that the create benchmarks compare
#                   against); busybox-static (the image the template tests
#                   push to a registry on loopback); the account `user`, the E2B
#                   templates' default user, as which the standalone envd of
#                   the compat suites and of the bench runs commands on the
#                   host; and the E2B SDKs of the compat suites: `npm ci` in
#                   compat-tests/js (and compat-tests/cli, E2B's CLI) from the
#                   committed package-lock.json, and
#                   a venv in compat-tests/python with requirements.txt
#                   (pinned by constraints.txt); and schemathesis, for
#                   `make test-schema`, in a venv in compat-tests/schema;
#                   prometheus and systemd-analyze for `make test-deploy`;
#                   libnss-myhostname for the SDK suites' domain mode;
#                   Let's Encrypt's ACME test servers pebble and
#                   pebble-challtestsrv (go install, into bin/tools) for
#                   cmd/sandboxd's ACME test.
#
# Packages come from apt-get, as root. Without root or apt-get it names what
# is missing and fails, rather than letting a build fail later on a cryptic
# pkg-config error.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "deps: $*" >&2; }
mode=${1:-all}
case $mode in build | schema | all) ;; *) log "usage: $0 [build|schema|all]"; exit 2 ;; esac

# --- Debian packages ---------------------------------------------------------
need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc)
[[ -e /usr/include/stdio.h ]] || need+=(libc6-dev)
[[ -e /usr/include/seccomp.h ]] || need+=(libseccomp-dev)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
if [[ $mode == all ]]; then
  command -v useradd >/dev/null 2>&1 || need+=(passwd)
  command -v timeout >/dev/null 2>&1 || need+=(coreutils)
  command -v ps >/dev/null 2>&1 || need+=(procps)
  command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
  # The template tests' image: a static busybox in a registry on loopback.
  [[ -x /bin/busybox && $(ldd /bin/busybox 2>&1) == *"not a dynamic"* ]] || need+=(busybox-static)
  # make test-deploy: a real Prometheus runs the dashboard's queries, and
  # systemd-analyze checks the unit.
  command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || need+=(prometheus)
  command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
  # The e2b CLI's terminal commands get a terminal from script(1).
  command -v script >/dev/null 2>&1 || need+=(bsdutils)
  # The SDK suites' domain mode resolves *.localhost as a laptop does.
  ldconfig -p 2>/dev/null | grep libnss_myhostname >/dev/null || need+=(libnss-myhostname)
  # The store's PostgreSQL dialect and two sandboxd sharing one database
  # (scripts/postgres.sh runs a throwaway server on loopback).
  [[ -x /usr/lib/postgresql/15/bin/postgres ]] || need+=(postgresql-15)
fi
if [[ $mode != build ]]; then
  python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
fi
if ((${#need[@]})); then
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    log "missing: ${need[*]} (Debian package names); install them as root (apt-get install ${need[*]}) and run this again"
    exit 1
  fi
  log "apt-get install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
[[ $mode == build ]] && exit 0

# A stamp of the inputs, kept inside what it describes, so a changed lock file
# or a deleted install directory re-runs the step.
stamp_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

# venv DIR STAMPED-FILE...: DIR/.venv with DIR/requirements.txt installed.
venv() {
  local dir=$1; shift
  local want; want=$(stamp_of "$@" <(python3 --version))
  if [[ $(cat "$dir/.venv/.deps-stamp" 2>/dev/null) != "$want" ]]; then
    log "python venv + pip install in $dir/.venv"
    rm -rf "$dir/.venv"
    python3 -m venv "$dir/.venv"
    "$dir/.venv/bin/pip" install -q --disable-pip-version-check -r "$dir/requirements.txt"
    echo "$want" >"$dir/.venv/.deps-stamp"
  fi
}

venv compat-tests/schema compat-tests/schema/requirements.txt
[[ $mode == schema ]] && { log "ok"; exit 0; }

# --- The E2B templates' default user, on the host ------------------------------
if ! id user >/dev/null 2>&1; then
  [[ $(id -u) == 0 ]] || { log "missing: the account 'user'; run this as root to create it"; exit 1; }
  log "useradd user"
  useradd -m -s /bin/bash user
fi

# --- JS compat suite (the SDKs, and E2B's CLI for its template commands) -------
for js in compat-tests/js compat-tests/cli; do
  want=$(stamp_of "$js/package-lock.json" <(node --version))
  if [[ $(cat "$js/node_modules/.deps-stamp" 2>/dev/null) != "$want" ]]; then
    log "npm ci in $js"
    (cd "$js" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$want" >"$js/node_modules/.deps-stamp"
  fi
done

# --- Python compat suite -------------------------------------------------------
venv compat-tests/python compat-tests/python/requirements.txt compat-tests/python/constraints.txt
venv compat-tests/schema compat-tests/schema/requirements.txt

# --- make test-deploy's checker: compose-go, a module of its own ---------------
(cd deploy/check && go mod download)

# --- ACME test servers: tools, not dependencies of the module --------------------
pebble_version=v2.10.3
if [[ $(cat bin/tools/.pebble-version 2>/dev/null) != "$pebble_version" ||
  ! -x bin/tools/pebble || ! -x bin/tools/pebble-challtestsrv ]]; then
  log "go install pebble and pebble-challtestsrv $pebble_version into bin/tools"
  GOBIN=$PWD/bin/tools go install \
    "github.com/letsencrypt/pebble/v2/cmd/pebble@$pebble_version" \
    "github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv@$pebble_version"
  echo "$pebble_version" >bin/tools/.pebble-version
fi
log "ok"
