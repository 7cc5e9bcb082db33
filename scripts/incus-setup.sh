#!/usr/bin/env bash
# Prepares this machine for the Incus backend (incus/), idempotently:
#   1. adds Debian's bookworm-backports suite, deriving its URI from apt's
#      existing debian.sources entry (no registry host is written here);
#   2. installs incus (6.0 from backports), btrfs-progs and debootstrap;
#   3. starts incusd in the background when its socket does not answer (no
#      systemd here) and waits for it;
#   4. creates a btrfs storage pool on a loop file (no network: sandboxes
#      are network-less, and this script never creates one);
#   5. builds the test image: a debootstrap minbase bookworm with python3
#      (and venv), nodejs, iproute2 (ss) and procps, a user "user" (uid
#      1000), a fallback /sbin/init and the host's CA bundle (what the local
#      backend's sandboxes see: a mirror or an egress proxy the host trusts
#      works from a template build's pip too), cached as a unified tarball
#      under /var/cache/sandboxd/incus, and imports it with an alias.
# Each step is skipped when already done. Prints how long each step took.
#
# Environment:
#   INCUS_POOL   storage pool name          (default sandboxd)
#   INCUS_POOL_SIZE                         (default 15GiB: a sparse loop file; every template layer is a whole root on it)
#   INCUS_IMAGE  alias of the test image    (default sandboxd-base)
#   CACHE        cache directory            (default /var/cache/sandboxd/incus)
set -euo pipefail

POOL=${INCUS_POOL:-sandboxd}
POOL_SIZE=${INCUS_POOL_SIZE:-15GiB}
ALIAS=${INCUS_IMAGE:-sandboxd-base}
CACHE=${CACHE:-/var/cache/sandboxd/incus}
SOCK=/var/lib/incus/unix.socket
DEAD_PROXY=http://127.0.0.1:9
# Bump to rebuild the cached image when its recipe changes.
IMAGE_VERSION=4

log() { echo "incus-setup: $*" >&2; }
step_start=0
step() { step_start=$EPOCHREALTIME; log "$*"; }
step_done() { log "  done in $(awk -v a="$step_start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}') s"; }

[[ $(id -u) == 0 ]] || { log "must run as root"; exit 1; }
export DEBIAN_FRONTEND=noninteractive

# The mirror the host's apt config names (no registry host is written here).
debian_uri() { "$(dirname "${BASH_SOURCE[0]}")/debian-uri.sh"; }

# --- 1+2. packages -----------------------------------------------------------
BP=/etc/apt/sources.list.d/sandboxd-bookworm-backports.sources
if ! command -v incus >/dev/null || ! command -v mkfs.btrfs >/dev/null || ! command -v debootstrap >/dev/null; then
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
    incus incus-client >/dev/null
  apt-get install -y -qq --no-install-recommends btrfs-progs debootstrap \
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
fi

# --- 5. test image -------------------------------------------------------------
tarball=$CACHE/sandboxd-base-v$IMAGE_VERSION.tar
if [[ ! -s $tarball ]]; then
  step "building $tarball (debootstrap minbase bookworm + python3, python3-venv, nodejs, iproute2, procps)"
  mkdir -p "$CACHE"
  work=$(mktemp -d "$CACHE/build.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  debootstrap --variant=minbase --include=python3,python3-venv,nodejs,iproute2,procps bookworm "$work/rootfs" "$(debian_uri)" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  r=$work/rootfs
  rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/lib/apt/lists/*
  chroot "$r" /usr/sbin/groupadd -g 1000 user
  chroot "$r" /usr/sbin/useradd -m -u 1000 -g 1000 -s /bin/bash user
  # Fallback init for `incus launch` without sandboxd (benchmarks); sandboxd
  # replaces it with envd through raw.lxc lxc.init.cmd.
  printf '#!/bin/sh\nexec sleep infinity\n' >"$r/sbin/init"
  chmod 755 "$r/sbin/init"
  mkdir -p "$r/opt/sandboxd" "$r/run/envd"
  # minbase has no ca-certificates; the host's bundle is what the local
  # backend's sandboxes trust (they see the host's /etc), so templates
  # built on either backend reach the same mirrors. A changed host bundle
  # needs an IMAGE_VERSION bump (or removing the cached tarball).
  if [[ -s /etc/ssl/certs/ca-certificates.crt ]]; then
    install -D -m 644 /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/ca-certificates.crt"
  fi
  printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"$r/etc/resolv.conf"
  cat >"$work/metadata.yaml" <<EOF
architecture: x86_64
creation_date: $(date +%s)
properties:
  description: sandboxd test image (Debian bookworm minbase + python3, python3-venv, nodejs, iproute2, procps, the host's CA bundle)
  os: debian
  release: bookworm
  variant: sandboxd-base-v$IMAGE_VERSION
EOF
  tar -C "$work" --numeric-owner -cf "$tarball.tmp" metadata.yaml rootfs
  mv "$tarball.tmp" "$tarball"
  rm -rf "$work"
  trap - EXIT
  step_done
fi
want_fp=$(sha256sum "$tarball" | cut -d' ' -f1)
have_fp=$(incus image info "$ALIAS" 2>/dev/null | awk '/^Fingerprint:/ {print $2}' || true)
if [[ $have_fp != "$want_fp" ]]; then
  step "importing $tarball as $ALIAS"
  [[ -n $have_fp ]] && incus image alias delete "$ALIAS"
  if incus image info "$want_fp" >/dev/null 2>&1; then
    incus image alias create "$ALIAS" "$want_fp"
  else
    incus image import "$tarball" --alias "$ALIAS"
  fi
  step_done
fi
log "ready: socket $SOCK, pool $POOL, image $ALIAS"
