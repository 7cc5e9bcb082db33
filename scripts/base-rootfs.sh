#!/usr/bin/env bash
# Builds sandboxd's base root filesystem, the `base` template of both
# backends (the local one reads it as a directory, scripts/incus-setup.sh
# imports it as an Incus image), from Debian packages only:
#   1. debootstrap --variant=minbase bookworm from the mirror the host's apt
#      config names (its debian.sources; no registry host is written here);
#   2. apt-get inside the new root, from the same sources, installs what
#      E2B's base image has (its python image plus Node, npm and sudo):
#      PACKAGES below;
#   3. a user "user" (uid/gid 1000, /home/user, bash) with passwordless
#      sudo, root's CA bundle plus the certificates only the host trusts (a
#      mirror or egress proxy the host trusts works from a sandbox's pip,
#      npm and curl too), pip allowed outside a venv as in E2B's image, and
#      the /etc a sandbox starts with (hosts, hostname, a resolv.conf that
#      fails fast: sandboxes with internet access get their own).
# The result is cached as $CACHE/debian-bookworm-<key>, key a hash of this
# script and of the host's CA bundle, so that a changed recipe or bundle
# builds a new directory (running sandboxes keep the old one as their
# lower layer) and an unchanged one is not rebuilt; $CACHE/rootfs links to
# the newest. Prints the directory on stdout, progress and timings on
# stderr. Runs as root; concurrent runs wait for one another.
#
# Environment:
#   CACHE   cache directory (default /var/cache/sandboxd/base)
set -euo pipefail

CACHE=${CACHE:-/var/cache/sandboxd/base}
# What E2B's base image has (python:3 with build tools, curl, git; Node
# and npm; sudo) in Debian's packages, with the tools sandboxd's own
# tests and templates use (iproute2's ss, procps' ps). libnss-myhostname
# resolves the sandbox's own host name (its id), which sudo looks up.
PACKAGES=(
  python3 python-is-python3 python3-pip python3-venv python3-dev
  nodejs npm
  build-essential git curl wget ca-certificates gnupg openssh-client
  sudo libnss-myhostname iproute2 iputils-ping procps psmisc socat less file
  unzip zip xz-utils bzip2 tzdata
)

log() { echo "base-rootfs: $*" >&2; }
t0=$EPOCHREALTIME
step_start=0
step() { step_start=$EPOCHREALTIME; log "$*"; }
step_done() { log "  done in $(awk -v a="$step_start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}') s"; }

[[ $(id -u) == 0 ]] || { log "must run as root"; exit 1; }
export DEBIAN_FRONTEND=noninteractive

host_bundle=/etc/ssl/certs/ca-certificates.crt
key=$({ cat "${BASH_SOURCE[0]}"; cat "$host_bundle" 2>/dev/null || true; } | sha256sum | cut -c1-12)
name=debian-bookworm-$key
dst=$CACHE/$name

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9

link() {
  if [[ $(readlink "$CACHE/rootfs" 2>/dev/null) != "$name" ]]; then
    ln -sfn "$name" "$CACHE/rootfs.tmp" && mv -T "$CACHE/rootfs.tmp" "$CACHE/rootfs"
  fi
  echo "$dst"
}
if [[ -d $dst ]]; then
  log "cached: $dst"
  link
  exit 0
fi

sources=/etc/apt/sources.list.d/debian.sources
uri=$("$(dirname "${BASH_SOURCE[0]}")/debian-uri.sh")
command -v debootstrap >/dev/null || { log "no debootstrap: run scripts/deps.sh build"; exit 1; }

work=$(mktemp -d "$CACHE/.build-XXXXXX")
r=$work/rootfs
cleanup() {
  mountpoint -q "$r/proc" 2>/dev/null && umount -l "$r/proc"
  rm -rf "$work"
}
trap cleanup EXIT

step "debootstrap minbase bookworm into $r"
debootstrap --variant=minbase bookworm "$r" "$uri" >"$work/debootstrap.log" 2>&1 ||
  { tail -20 "$work/debootstrap.log" >&2; exit 1; }
step_done

step "installing ${#PACKAGES[@]} packages and their dependencies"
# The host's sources (the same mirror, with updates and security) instead
# of debootstrap's one line; the host's resolver for the downloads; no
# daemon started by a maintainer script; /proc for those that read it.
cp "$sources" "$r/etc/apt/sources.list.d/debian.sources"
rm -f "$r/etc/apt/sources.list"
cat /etc/resolv.conf >"$r/etc/resolv.conf"
printf '#!/bin/sh\nexit 101\n' >"$r/usr/sbin/policy-rc.d"
chmod 755 "$r/usr/sbin/policy-rc.d"
mount -t proc proc "$r/proc"
chroot "$r" apt-get update -qq
chroot "$r" apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >"$work/apt.log" 2>&1 ||
  { tail -30 "$work/apt.log" >&2; exit 1; }
log "  $(chroot "$r" dpkg-query -W -f='.\n' | wc -l) packages installed"
step_done

step "configuring users, sudo, CA certificates, /etc"
chroot "$r" groupadd -g 1000 user
chroot "$r" useradd -m -u 1000 -g 1000 -s /bin/bash user
echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' >"$r/etc/sudoers.d/user"
chmod 440 "$r/etc/sudoers.d/user"
# The host's certificates that Debian's bundle lacks, as local
# certificates: update-ca-certificates (run again by any later package
# that triggers it) keeps them in the bundle.
if [[ -s $host_bundle ]]; then
  n=$(awk -v bundle="$r/etc/ssl/certs/ca-certificates.crt" -v dir="$r/usr/local/share/ca-certificates" '
    BEGIN { while ((getline line < bundle) > 0) { cur = cur line "\n"; if (line ~ /^-----END/) { have[cur] = 1; cur = "" } } }
    { cur = cur $0 "\n" }
    /^-----END/ { if (cur ~ /-----BEGIN CERTIFICATE-----/ && !(cur in have)) { n++; f = sprintf("%s/sandboxd-host-%d.crt", dir, n); printf "%s", cur > f; close(f) } cur = "" }
    END { print n + 0 }
  ' "$host_bundle")
  if ((n > 0)); then
    chroot "$r" update-ca-certificates >/dev/null
  fi
  log "  $n certificate(s) of the host's bundle added"
fi
# pip installs outside a venv, as in E2B's (python:3) base image.
printf '[global]\nbreak-system-packages = true\n' >"$r/etc/pip.conf"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$r/etc/hosts"
echo sandbox >"$r/etc/hostname"
printf 'nameserver 127.0.0.1\noptions timeout:1 attempts:1\n' >"$r/etc/resolv.conf"
# Where envd and its socket directory are mounted.
mkdir -p "$r/opt/sandboxd" "$r/run/envd"
: >"$r/opt/sandboxd/envd"
chmod 755 "$r/opt/sandboxd/envd"
chmod 700 "$r/run/envd"
umount "$r/proc"
rm -f "$r/usr/sbin/policy-rc.d"
chroot "$r" apt-get clean
rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/log/apt/* "$r"/var/log/dpkg.log \
  "$r"/root/.cache "$r"/tmp/* "$r"/var/tmp/*
step_done

mv -T "$r" "$dst"
log "built $dst ($(du -sh "$dst" | cut -f1)) in $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.0f", b-a}') s"
link
