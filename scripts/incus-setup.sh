#!/usr/bin/env bash
# Prepares this machine for the Incus backend (incus/), idempotently:
#   1. adds Debian's bookworm-backports suite, deriving its URI from apt's
#      existing debian.sources entry (no registry host is written here);
#   2. installs incus (6.0 from backports), btrfs-progs (from backports too:
#      6.7 or later, for simple quotas) and debootstrap;
#   3. starts incusd in the background when its socket does not answer (no
#      systemd here) and waits for it;
#   4. creates a btrfs storage pool on a loop file (no network: sandboxes
#      are network-less, and this script never creates one) and turns on
#      btrfs' simple quotas on it (see below);
#   5. imports sandboxd's base root filesystem (scripts/base-rootfs.sh: a
#      Debian bookworm with Python, Node and npm, git, curl, sudo …, the
#      local backend's base too) as the image of template base, with a
#      fallback /sbin/init, cached as a unified tarball under
#      /var/cache/sandboxd/incus, and deletes the image it replaces;
#   6. unpacks it onto the pool once (incusd does that at an image's first
#      instance, which would otherwise be the first sandbox's create).
# Each step is skipped when already done. Prints how long each step took.
#
# Environment:
#   INCUS_POOL   storage pool name          (default sandboxd)
#   INCUS_POOL_SIZE                         (default 30GiB: a sparse loop file; every template layer is a whole root on it,
#                                            and the test cluster's members, their templates and the replicas of those
#                                            share it; an existing pool smaller than this is grown)
#   INCUS_IMAGE  alias of the test image    (default sandboxd-base)
#   CACHE        cache directory            (default /var/cache/sandboxd/incus)
set -euo pipefail

POOL=${INCUS_POOL:-sandboxd}
POOL_SIZE=${INCUS_POOL_SIZE:-30GiB}
ALIAS=${INCUS_IMAGE:-sandboxd-base}
CACHE=${CACHE:-/var/cache/sandboxd/incus}
SOCK=/var/lib/incus/unix.socket
DEAD_PROXY=http://127.0.0.1:9
# Bump to rebuild the cached image when its recipe changes.
IMAGE_VERSION=5

log() { echo "incus-setup: $*" >&2; }
step_start=0
step() { step_start=$EPOCHREALTIME; log "$*"; }
step_done() { log "  done in $(awk -v a="$step_start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}') s"; }

[[ $(id -u) == 0 ]] || { log "must run as root"; exit 1; }
export DEBIAN_FRONTEND=noninteractive

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The mirror the host's apt config names (no registry host is written here).
debian_uri() { "$here/debian-uri.sh"; }
# shellcheck source=scripts/incus-image.sh
. "$here/incus-image.sh"

# --- 1+2. packages -----------------------------------------------------------
BP=/etc/apt/sources.list.d/sandboxd-bookworm-backports.sources
simple_quotas_cli() { btrfs quota enable --help 2>&1 | grep -q -- --simple; }
if ! command -v incus >/dev/null || ! command -v mkfs.btrfs >/dev/null || ! command -v debootstrap >/dev/null || ! simple_quotas_cli; then
  step "installing incus, btrfs-progs, debootstrap"
  uri=$(debian_uri)
  if [[ ! -e $BP ]]; then
    cat >"$BP" <<EOF
Types: deb
URIs: $uri
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  apt-get update -qq
  # policy-rc.d: no init system to start services from maintainer scripts
  # (ours only if there is none already).
  own_policy=
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
    own_policy=1
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get install -y -qq --no-install-recommends -t bookworm-backports \
    incus incus-client btrfs-progs >/dev/null
  apt-get install -y -qq --no-install-recommends debootstrap \
    squashfs-tools xz-utils rsync attr >/dev/null
  if [[ -n $own_policy ]]; then
    rm -f /usr/sbin/policy-rc.d
    trap - EXIT
  fi
  step_done
fi

# --- 3. incusd -----------------------------------------------------------------
if ! incus query /1.0 >/dev/null 2>&1; then
  step "starting incusd"
  incusd_bin=$(command -v incusd || true)
  [[ -n $incusd_bin ]] || incusd_bin=/usr/libexec/incus/incusd
  [[ -x $incusd_bin ]] || incusd_bin=/usr/lib/incus/incusd
  mkdir -p /var/log/incus
  # setsid: the daemon outlives this script and its session. The proxy
  # variables point at a dead loopback port: incusd fetches "instance
  # types" from the internet at start and daily; with them it only ever
  # connects to 127.0.0.1 (and resolves no name). core.proxy_* below keep
  # it so for later runs.
  HTTPS_PROXY=$DEAD_PROXY HTTP_PROXY=$DEAD_PROXY https_proxy=$DEAD_PROXY http_proxy=$DEAD_PROXY \
    NO_PROXY= no_proxy= \
    setsid "$incusd_bin" --group root --logfile /var/log/incus/incusd.log \
    </dev/null >>/var/log/incus/incusd.out 2>&1 &
  incus admin waitready --timeout=60
  step_done
fi
# No outbound traffic from incusd (see above); no image auto-update.
for kv in core.proxy_https=$DEAD_PROXY core.proxy_http=$DEAD_PROXY images.auto_update_interval=0; do
  k=${kv%%=*} v=${kv#*=}
  [[ $(incus config get "$k") == "$v" ]] || incus config set "$k" "$v"
done

# --- 4. storage pool -----------------------------------------------------------
if ! incus storage show "$POOL" >/dev/null 2>&1; then
  step "creating btrfs pool $POOL ($POOL_SIZE loop file)"
  incus storage create "$POOL" btrfs size="$POOL_SIZE"
  step_done
elif [[ $(incus storage get "$POOL" source 2>/dev/null) == *.img ]]; then
  # A loop pool made with a smaller default: grown (never shrunk).
  have=$(incus query "/1.0/storage-pools/$POOL/resources" | python3 -c 'import json,sys; print(json.load(sys.stdin)["space"]["total"])')
  want=$(numfmt --from=iec-i "${POOL_SIZE%B}")
  if (( have < want * 95 / 100 )); then
    step "growing pool $POOL to $POOL_SIZE"
    incus storage set "$POOL" size="$POOL_SIZE"
    step_done
  fi
fi

# Simple quotas (squota, Linux 6.7+): an extent counts against the subvolume
# that wrote it, so a sandbox's root size limits what it writes, and deleting
# a clone costs the kernel nothing to account. Full quota groups (the mode
# Incus would turn on) account every extent a clone shares with its image on
# delete: 7.5 s of btrfs-cleaner CPU per sandbox of the Debian base here, a
# queue that outlived CI. The switch drops the groups and their limits, so
# the sandboxes live at that moment (none on a fresh pool) keep no size.
pool_dir=/var/lib/incus/storage-pools/$POOL
fsid=$(btrfs filesystem show "$pool_dir" | awk '/uuid:/ {print $NF; exit}')
qmode=$(cat "/sys/fs/btrfs/$fsid/qgroups/mode" 2>/dev/null || echo disabled)
if [[ $qmode != squota && -e /sys/fs/btrfs/features/simple_quota ]]; then
  step "simple quotas on pool $POOL (were: $qmode)"
  [[ $qmode == disabled ]] || btrfs quota disable "$pool_dir"
  btrfs quota enable --simple "$pool_dir"
  step_done
fi

# --- 5. base image -------------------------------------------------------------
# The root filesystem is the local backend's base too (scripts/base-rootfs.sh,
# cached; it waits for a concurrent build of it), plus a fallback /sbin/init.
rootfs=$("$here/base-rootfs.sh")
tarball=$CACHE/sandboxd-base-v$IMAGE_VERSION-$(basename "$rootfs").tar
if [[ ! -s $tarball ]]; then
  step "building $tarball from $rootfs"
  mkdir -p "$CACHE"
  work=$(mktemp -d "$CACHE/build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  # Fallback init for `incus launch` without sandboxd (benchmarks); sandboxd
  # replaces it with envd through raw.lxc lxc.init.cmd.
  # (In usr/sbin: the merged /usr's /sbin is a link to it.)
  sbin=sbin
  [[ -L $rootfs/sbin ]] && sbin=usr/sbin
  mkdir -p "$work/rootfs/$sbin"
  printf '#!/bin/sh\nexec sleep infinity\n' >"$work/rootfs/$sbin/init"
  chmod 755 "$work/rootfs/$sbin/init"
  cat >"$work/metadata.yaml" <<EOF
architecture: x86_64
creation_date: $(date +%s)
properties:
  description: sandboxd base (scripts/base-rootfs.sh, $(basename "$rootfs"))
  os: debian
  release: bookworm
  variant: sandboxd-base-v$IMAGE_VERSION
EOF
  # The base's directory as rootfs/, then the init (Debian's minbase has
  # none, so no entry is there twice).
  tar --numeric-owner -cf "$tarball.tmp" -C "$work" metadata.yaml \
    -C "$(dirname "$rootfs")" --transform "s,^$(basename "$rootfs"),rootfs," "$(basename "$rootfs")" \
    -C "$work" "rootfs/$sbin/init"
  mv "$tarball.tmp" "$tarball"
  rm -rf "$work"
  trap - EXIT
  step_done
fi
want_fp=$(sha256sum "$tarball" | cut -d' ' -f1)
if [[ $(image_fingerprint "$ALIAS") != "$want_fp" ]]; then
  step "importing $tarball as $ALIAS"
  point_alias "$tarball" "$want_fp" "$ALIAS"
  # Older recipes' tarballs go too.
  find "$CACHE" -maxdepth 1 -name 'sandboxd-base-v*.tar' ! -path "$tarball" -delete
  step_done
fi

# --- 6. the image's volume on the pool -------------------------------------------
# incusd unpacks an image into a volume of the pool at its first instance and
# clones that volume from then on: done here, once, not in the first create.
if ! incus storage volume show "$POOL" "image/$want_fp" >/dev/null 2>&1; then
  step "unpacking $ALIAS onto pool $POOL"
  warm=sandboxd-setup-unpack
  incus delete -f "$warm" >/dev/null 2>&1 || true
  out=$(incus init "$ALIAS" "$warm" --storage "$POOL" --no-profiles 2>&1) || { echo "$out" >&2; exit 1; }
  incus delete "$warm"
  step_done
fi
log "ready: socket $SOCK, pool $POOL, image $ALIAS"
