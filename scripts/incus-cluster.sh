#!/usr/bin/env bash
# A real 3-member Incus cluster inside this machine, for sandboxd's clustered
# Incus backend (issue 27): nested Incus in three privileged system
# containers of the host's Incus (KVM guests do not boot here). Built from
# nothing by `up`, removed by `down`. See incus/README.md, "Cluster test bed".
#
#   up [--binaries-only]  idempotent; prints how long each step took:
#     1. host: dnsmasq-base (Incus needs it for a bridge with DHCP, which a
#        NIC with a fixed ipv4.address requires), then the bridge sbdcbr0,
#        10.210.0.1/24, NAT on (members reach Debian's mirror), no IPv6;
#     2. the member image: Debian bookworm (debootstrap from the mirror the
#        host's apt config names, scripts/debian-uri.sh) with systemd as
#        init, incus-base/incus-client 6.0 and btrfs-progs from
#        bookworm-backports, nftables, ca-certificates; cached as a unified
#        tarball $CACHE/member-v<version>.tar, imported as the host image
#        sandboxd-cluster-member;
#     3. a client certificate for sandboxd (ECDSA P-256, openssl);
#     4. containers sbdc-1..3 (privileged, nesting, 4 GiB, root on the
#        host's pool sandboxd, eth0 on sbdcbr0 at 10.210.0.11..13, set
#        statically by systemd-networkd too);
#     5. the cluster: sbdc-1 bootstraps as m1 (incus admin init --preseed),
#        sbdc-2/3 join as m2/m3 with join tokens; incusd on <ip>:8443;
#        storage pool sandboxd, btrfs, source = a subvolume on the member's
#        own root (which is on the host's btrfs pool: no loop file, no copy
#        of an image per instance); core.proxy_* dead (no outbound traffic
#        from incusd), cluster.images_minimal_replica=-1 (every image on
#        every member);
#     6. the client certificate trusted by the cluster;
#     7. the host's cached sandboxd-base tarball (scripts/incus-setup.sh)
#        imported into the cluster as sandboxd-base (sbdc-1 reads it from a
#        read-only disk device of the host's cache directory), unpacked on
#        every member's pool once;
#     8. $SANDBOXD_AGENT as envd, and $SANDBOXD_BIN's sandboxd (default
#        <repo>/bin, `make build`) in /usr/local/lib/sandboxd/ on every member, with the client
#        certificate, and the relay as the systemd unit sandboxd-relay (only
#        if the binary knows `relay`; otherwise a warning):
#          sandboxd relay --listen <ip>:8444 --cert /var/lib/incus/cluster.crt
#            --key /var/lib/incus/cluster.key
#            --client-cert /usr/local/lib/sandboxd/client.crt
#            --sandbox-subnet 10.135.0.0/16
#     9. under $STATE: client.crt, client.key, cluster.crt (the certificate
#        the members serve on :8443, checked against each member's
#        /var/lib/incus/cluster.crt), incus/ (an INCUS_CONF for the host's
#        incus CLI, remote "sbdc", default), and env (below).
#     --binaries-only (or `push`): only step 8, relays restarted.
#   image     only the member image's tarball (step 2 without the import):
#             needs debootstrap, not Incus, so that CI builds it (≈ 1 min,
#             mostly downloads) while other work runs; `up` waits for it.
#   down      deletes the containers (the cluster with its trust and
#             images goes with them), the bridge, the member image and
#             $STATE; keeps $CACHE and dnsmasq-base.
#   status    the containers, the cluster's members, the relays.
#   stop N    `incus stop -f sbdc-N` (a member dying).
#   start N   starts sbdc-N again; systemd starts incusd and the relay;
#             waits until the member is ONLINE and answers requests
#             forwarded to it.
#   env       prints $STATE/env:
#               SANDBOXD_INCUS_URL, SANDBOXD_INCUS_CLIENT_CERT,
#               SANDBOXD_INCUS_CLIENT_KEY, SANDBOXD_INCUS_SERVER_CERT,
#               SANDBOXD_CLUSTER_MEMBERS="m1=10.210.0.11 m2=… m3=…"
#   push      = up --binaries-only
#
# The host must be ready for the Incus backend (scripts/incus-setup.sh: pool
# sandboxd, image sandboxd-base and its cached tarball); `up` runs that
# script when something of it is missing. Nothing of the host's Incus is
# changed but what this script adds. No registry host is written here.
#
# Environment:
#   SANDBOXD_BIN   directory with envd and sandboxd  (default <repo>/bin)
#   SANDBOXD_AGENT the in-sandbox agent the members run as envd (default
#                  $SANDBOXD_BIN/envd-rs where built, else $SANDBOXD_BIN/envd:
#                  the agent sandboxd serve picks)
#   STATE          state directory                   (default /var/lib/sandboxd-cluster)
#   CACHE          cache directory                   (default /var/cache/sandboxd/cluster)
#   MEMBER_MEMORY  limits.memory of each member      (default 4GiB)
#   RELAY_EGRESS_ALLOW  CIDRs (comma-separated) the relays' firewall lets
#                  sandboxes with internet reach although private or
#                  special-purpose (their --egress-allow-cidr), e.g. a
#                  package mirror on such an address; default none
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/incus-image.sh
. "$here/incus-image.sh"
# `incus` means the host's Incus here; cx() (below) talks to the cluster.
unset INCUS_CONF INCUS_REMOTE INCUS_PROJECT
repo=$(cd "$here/.." && pwd)
STATE=${STATE:-/var/lib/sandboxd-cluster}
CACHE=${CACHE:-/var/cache/sandboxd/cluster}
BASE_CACHE=/var/cache/sandboxd/incus
SANDBOXD_BIN=${SANDBOXD_BIN:-$repo/bin}
if [[ -z ${SANDBOXD_AGENT:-} ]]; then
  SANDBOXD_AGENT=$SANDBOXD_BIN/envd-rs
  [[ -f $SANDBOXD_AGENT ]] || SANDBOXD_AGENT=$SANDBOXD_BIN/envd
fi
MEMBER_MEMORY=${MEMBER_MEMORY:-4GiB}
HOST_POOL=sandboxd
NET=sbdcbr0
NET_PREFIX=10.210.0
MEMBER_ALIAS=sandboxd-cluster-member
BASE_ALIAS=sandboxd-base
POOL=sandboxd
# The inner pool's source: a btrfs subvolume that inner incusd creates on
# the member's root (itself a subvolume of the host's pool).
POOL_SOURCE=/var/lib/sandboxd-pool
SANDBOX_SUBNET=10.135.0.0/16
LIB=/usr/local/lib/sandboxd
DEAD_PROXY=http://127.0.0.1:9
MEMBERS=(1 2 3)
# Bump to rebuild the cached member image when its recipe changes.
MEMBER_VERSION=1
MEMBER_TAR=$CACHE/member-v$MEMBER_VERSION.tar

log() { echo "incus-cluster: $*" >&2; }
die() { log "$*"; exit 1; }
step_start=0
step() { step_start=$EPOCHREALTIME; log "$*"; }
step_done() { log "  done in $(since "$step_start") s"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}'; }

ct() { echo "sbdc-$1"; }           # host container of member N
mname() { echo "m$1"; }           # its cluster member name
mip() { echo "$NET_PREFIX.1$1"; }  # its address
mx() { local n=$1; shift; incus exec "$(ct "$n")" -- "$@"; }
# The host's incus CLI against the cluster.
cx() { INCUS_CONF=$STATE/incus incus "$@"; }
exists() { incus info "$(ct "$1")" >/dev/null 2>&1; }
running() { [[ $(incus query "/1.0/instances/$(ct "$1")" 2>/dev/null | jq -r .status) == Running ]]; }

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# --- host prerequisites ---------------------------------------------------------
host_ready() {
  if ! incus query /1.0 >/dev/null 2>&1 || ! incus storage show "$HOST_POOL" >/dev/null 2>&1 ||
    ! incus image info "$BASE_ALIAS" >/dev/null 2>&1 || ! compgen -G "$BASE_CACHE/$BASE_ALIAS-v*.tar" >/dev/null; then
    step "host not ready for Incus: scripts/incus-setup.sh"
    "$here/incus-setup.sh"
    step_done
  fi
  if ! command -v dnsmasq >/dev/null; then
    step "installing dnsmasq-base (Incus bridges with DHCP)"
    apt-get install -y -qq --no-install-recommends dnsmasq-base >/dev/null ||
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends dnsmasq-base >/dev/null; }
    step_done
  fi
  command -v openssl >/dev/null || die "no openssl"
}

host_network() {
  if ! incus network show "$NET" >/dev/null 2>&1; then
    step "host bridge $NET ($NET_PREFIX.1/24, NAT, no IPv6)"
    incus network create "$NET" ipv4.address="$NET_PREFIX.1/24" ipv4.nat=true \
      ipv4.dhcp.ranges="$NET_PREFIX.100-$NET_PREFIX.199" ipv6.address=none \
      --description "sandboxd cluster test bed (scripts/incus-cluster.sh)" >/dev/null
    step_done
  fi
}

# --- member image --------------------------------------------------------------
build_member_image() {
  step "building the member image $MEMBER_TAR (debootstrap + incus from backports)"
  command -v debootstrap >/dev/null || die "no debootstrap: run scripts/incus-setup.sh"
  local uri work r
  uri=$("$here/debian-uri.sh")
  mkdir -p "$CACHE"
  work=$(mktemp -d "$CACHE/.build-XXXXXX")
  r=$work/rootfs
  # shellcheck disable=SC2064
  trap "mountpoint -q '$r/proc' && umount -l '$r/proc'; rm -rf '$work'" EXIT
  debootstrap --variant=minbase bookworm "$r" "$uri" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  log "  debootstrap done at $(since "$step_start") s"
  # The host's sources (same mirror, updates, security) plus backports; the
  # host's resolver for the downloads; no daemon started by a maintainer
  # script.
  cp /etc/apt/sources.list.d/debian.sources "$r/etc/apt/sources.list.d/debian.sources"
  cat >"$r/etc/apt/sources.list.d/bookworm-backports.sources" <<EOF
Types: deb
URIs: $uri
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -f "$r/etc/apt/sources.list"
  cat /etc/resolv.conf >"$r/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' >"$r/usr/sbin/policy-rc.d"
  chmod 755 "$r/usr/sbin/policy-rc.d"
  mount -t proc proc "$r/proc"
  chroot "$r" apt-get update -qq
  chroot "$r" apt-get install -y -qq --no-install-recommends \
    systemd systemd-sysv dbus iproute2 iputils-ping netcat-openbsd procps less curl \
    nftables ca-certificates >"$work/apt.log" 2>&1 || { tail -30 "$work/apt.log" >&2; exit 1; }
  chroot "$r" apt-get install -y -qq --no-install-recommends -t bookworm-backports \
    incus-base incus-client btrfs-progs >>"$work/apt.log" 2>&1 || { tail -30 "$work/apt.log" >&2; exit 1; }
  log "  $(chroot "$r" dpkg-query -W -f='.\n' | wc -l) packages, incus $(chroot "$r" dpkg-query -W -f='${Version}' incus-base), at $(since "$step_start") s"
  # systemd: networkd brings eth0 up (its file is per member, written by
  # `up`); incusd starts at boot (not only on its socket), without any
  # outbound traffic (dead proxy, as scripts/incus-setup.sh); no timers
  # that reach out, no lxcfs (no /dev/fuse in the member).
  chroot "$r" systemctl enable systemd-networkd.service >/dev/null 2>&1
  for u in lxcfs.service apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service \
    fstrim.timer systemd-networkd-wait-online.service incus-startup.service; do
    ln -sfn /dev/null "$r/etc/systemd/system/$u"
  done
  # systemd mounts the cgroup v1 controllers cpu and cpuacct joined
  # (cpu,cpuacct), which fails when the host has them apart (this one
  # does): the member then has neither, and inner LXC cannot start a
  # container ("Failed to initialize cgroups"). Mounted apart before incusd
  # starts (it reads the cgroup layout once).
  cat >"$r/usr/local/sbin/sbdc-cgroups" <<'EOS'
#!/bin/sh
# Mounts the cgroup v1 hierarchies of /proc/self/cgroup that systemd did not
# mount under /sys/fs/cgroup (scripts/incus-cluster.sh).
set -eu
need=
while IFS=: read -r id ctrls _; do
  [ "$id" != 0 ] || continue
  mountpoint -q "/sys/fs/cgroup/${ctrls#name=}" || need="$need $ctrls"
done </proc/self/cgroup
[ -n "$need" ] || exit 0
mount -o remount,rw /sys/fs/cgroup
for ctrls in $need; do
  d=/sys/fs/cgroup/${ctrls#name=}
  [ ! -L "$d" ] || rm -f "$d"
  mkdir -p "$d"
  mount -t cgroup -o "$ctrls" cgroup "$d"
done
mount -o remount,ro /sys/fs/cgroup
EOS
  chmod 755 "$r/usr/local/sbin/sbdc-cgroups"
  mkdir -p "$r/etc/systemd/system/incus.service.d" "$r/etc/systemd/system/multi-user.target.wants"
  cat >"$r/etc/systemd/system/incus.service.d/sandboxd-cluster.conf" <<EOF
[Unit]
After=systemd-networkd.service
[Service]
ExecStartPre=/usr/local/sbin/sbdc-cgroups
Environment=HTTP_PROXY=$DEAD_PROXY HTTPS_PROXY=$DEAD_PROXY http_proxy=$DEAD_PROXY https_proxy=$DEAD_PROXY NO_PROXY=$NET_PREFIX.0/24 no_proxy=$NET_PREFIX.0/24
EOF
  ln -sfn /lib/systemd/system/incus.service "$r/etc/systemd/system/multi-user.target.wants/incus.service"
  printf 'nameserver %s.1\n' "$NET_PREFIX" >"$r/etc/resolv.conf"
  rm -f "$r/etc/hostname" "$r/usr/sbin/policy-rc.d"
  : >"$r/etc/machine-id"
  umount "$r/proc"
  chroot "$r" apt-get clean
  rm -rf "$r"/var/lib/apt/lists/* "$r"/var/cache/apt/*.bin "$r"/var/log/apt/* "$r"/var/log/dpkg.log "$r"/tmp/* "$r"/var/tmp/*
  cat >"$work/metadata.yaml" <<EOF
architecture: x86_64
creation_date: $(date +%s)
properties:
  description: sandboxd cluster member v$MEMBER_VERSION (Debian bookworm, incus $(chroot "$r" dpkg-query -W -f='${Version}' incus-base))
  os: debian
  release: bookworm
  variant: sandboxd-cluster-member-v$MEMBER_VERSION
EOF
  tar --numeric-owner --xattrs --xattrs-include='*' -cf "$MEMBER_TAR.tmp" -C "$work" metadata.yaml rootfs
  mv "$MEMBER_TAR.tmp" "$MEMBER_TAR"
  sha256sum "$MEMBER_TAR" | cut -d' ' -f1 >"$MEMBER_TAR.sha256"
  rm -rf "$work"
  trap - EXIT
  # Older recipes' tarballs go.
  find "$CACHE" -maxdepth 1 -name 'member-v*.tar*' ! -name "member-v$MEMBER_VERSION.tar*" -delete
  log "  $(du -h "$MEMBER_TAR" | cut -f1)"
  step_done
}

member_image() {
  [[ -s $MEMBER_TAR && -s $MEMBER_TAR.sha256 ]] || build_member_image
  local want
  want=$(cat "$MEMBER_TAR.sha256")
  if [[ $(image_fingerprint "$MEMBER_ALIAS") != "$want" ]]; then
    step "importing $MEMBER_TAR as $MEMBER_ALIAS"
    point_alias "$MEMBER_TAR" "$want" "$MEMBER_ALIAS"
    step_done
  fi
}

# --- client certificate ----------------------------------------------------------
client_cert() {
  mkdir -p "$STATE"
  chmod 700 "$STATE"
  if [[ ! -s $STATE/client.crt || ! -s $STATE/client.key ]]; then
    step "client certificate (ECDSA P-256)"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -sha256 -days 3650 \
      -subj "/CN=sandboxd@$(hostname)" -addext extendedKeyUsage=clientAuth \
      -keyout "$STATE/client.key.tmp" -out "$STATE/client.crt.tmp" 2>/dev/null
    chmod 600 "$STATE/client.key.tmp"
    mv "$STATE/client.key.tmp" "$STATE/client.key"
    mv "$STATE/client.crt.tmp" "$STATE/client.crt"
    step_done
  fi
}
cert_fp() { openssl x509 -in "$1" -outform der | sha256sum | cut -d' ' -f1; }

# --- member containers --------------------------------------------------------------
create_member() {
  local n=$1 c ip tmp out
  c=$(ct "$n") ip=$(mip "$n")
  step "creating $c ($ip)"
  out=$(incus init "$MEMBER_ALIAS" "$c" --no-profiles -s "$HOST_POOL" \
    -c security.privileged=true -c security.nesting=true -c limits.memory="$MEMBER_MEMORY" \
    -c user.sandboxd-cluster=member 2>&1) || { echo "$out" >&2; exit 1; }
  incus config device add "$c" eth0 nic network="$NET" name=eth0 ipv4.address="$ip" >/dev/null
  if [[ $n == 1 ]]; then
    # The host's cache of sandboxd-base's tarball, read-only: imported into
    # the cluster from here, not copied in.
    incus config device add "$c" base-cache disk source="$BASE_CACHE" path=/var/cache/sandboxd-host readonly=true >/dev/null
  fi
  tmp=$(mktemp -d)
  cat >"$tmp/net" <<EOF
[Match]
Name=eth0

[Network]
Address=$ip/24
Gateway=$NET_PREFIX.1
LinkLocalAddressing=no
IPv6AcceptRA=no
EOF
  incus file push -q "$tmp/net" "$c/etc/systemd/network/10-eth0.network"
  printf 'RELAY_ADDR=%s\n' "$ip" >"$tmp/relay"
  incus file push -q "$tmp/relay" "$c/etc/sandboxd-relay.env"
  rm -rf "$tmp"
  step_done
}

# Waits until incusd answers inside member N.
wait_incusd() {
  local n=$1 i
  for ((i = 0; i < 300; i++)); do
    if mx "$n" incus admin waitready --timeout=1 >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  die "incusd in $(ct "$n") does not answer"
}

members() {
  local n started=()
  for n in "${MEMBERS[@]}"; do
    exists "$n" || create_member "$n"
  done
  for n in "${MEMBERS[@]}"; do
    running "$n" || started+=("$n")
  done
  if ((${#started[@]})); then
    step "starting ${started[*]/#/sbdc-} and waiting for their incusd"
    for n in "${started[@]}"; do incus start "$(ct "$n")"; done
    for n in "${started[@]}"; do wait_incusd "$n"; done
    step_done
  fi
}

# --- cluster --------------------------------------------------------------------------
clustered() { mx "$1" incus query /1.0 2>/dev/null | grep -q '"server_clustered": true'; }
in_cluster() { mx 1 incus cluster list -f csv -c n 2>/dev/null | grep -qx "$(mname "$1")"; }

bootstrap() {
  clustered 1 && return 0
  step "bootstrapping the cluster on $(ct 1) as $(mname 1)"
  mx 1 incus admin init --preseed <<EOF
config:
  core.https_address: $(mip 1):8443
  core.proxy_http: $DEAD_PROXY
  core.proxy_https: $DEAD_PROXY
  core.proxy_ignore_hosts: $NET_PREFIX.0/24
  images.auto_update_interval: "0"
  cluster.images_minimal_replica: "-1"
storage_pools:
- name: $POOL
  driver: btrfs
  config:
    source: $POOL_SOURCE
cluster:
  server_name: $(mname 1)
  enabled: true
EOF
  step_done
}

join() {
  local n=$1 token
  if in_cluster "$n"; then
    clustered "$n" && return 0
    # sbdc-N was made anew: its old self goes from the cluster first.
    step "removing the stale member $(mname "$n") from the cluster"
    mx 1 incus cluster remove --force --yes "$(mname "$n")" >/dev/null
    step_done
  fi
  clustered "$n" && die "$(ct "$n") is clustered but not a member of $(ct 1)'s cluster: run down, then up"
  step "joining $(ct "$n") as $(mname "$n")"
  mx 1 incus cluster revoke-token "$(mname "$n")" >/dev/null 2>&1 || true
  token=$(mx 1 incus cluster add "$(mname "$n")" | tail -n1)
  mx "$n" incus admin init --preseed <<EOF
cluster:
  enabled: true
  server_name: $(mname "$n")
  server_address: $(mip "$n"):8443
  cluster_address: $(mip 1):8443
  cluster_token: $token
  member_config:
  - entity: storage-pool
    name: $POOL
    key: source
    value: $POOL_SOURCE
EOF
  step_done
}

cluster_config() {
  local kv k v
  for kv in core.proxy_http=$DEAD_PROXY core.proxy_https=$DEAD_PROXY core.proxy_ignore_hosts=$NET_PREFIX.0/24 images.auto_update_interval=0 cluster.images_minimal_replica=-1; do
    k=${kv%%=*} v=${kv#*=}
    # key=value in one argument: a value such as -1 would be read as a flag.
    [[ $(mx 1 incus config get "$k") == "$v" ]] || mx 1 incus config set "$k=$v"
  done
}

trust() {
  local fp
  fp=$(cert_fp "$STATE/client.crt")
  if ! mx 1 incus query /1.0/certificates | grep -q "/1.0/certificates/$fp\""; then
    step "trusting the client certificate (${fp:0:12})"
    incus file push -q "$STATE/client.crt" "$(ct 1)/root/sandboxd-client.crt"
    mx 1 incus config trust add-certificate /root/sandboxd-client.crt --name sandboxd
    mx 1 rm -f /root/sandboxd-client.crt
    step_done
  fi
}

# The certificate served on :8443 (the cluster's), checked against each
# member's /var/lib/incus/cluster.crt; the host's incus CLI config.
server_cert() {
  local served n tmp
  tmp=$(mktemp)
  served=$(openssl s_client -connect "$(mip 1):8443" -servername m1 </dev/null 2>/dev/null | openssl x509)
  [[ -n $served ]] || die "no certificate on $(mip 1):8443"
  for n in "${MEMBERS[@]}"; do
    incus file pull "$(ct "$n")/var/lib/incus/cluster.crt" "$tmp"
    [[ $(openssl x509 -in "$tmp") == "$served" ]] || die "$(ct "$n")'s /var/lib/incus/cluster.crt is not the certificate served on $(mip 1):8443"
  done
  rm -f "$tmp"
  if [[ $(cat "$STATE/cluster.crt" 2>/dev/null) != "$served" ]]; then
    echo "$served" >"$STATE/cluster.crt"
  fi
  mkdir -p "$STATE/incus/servercerts"
  cp "$STATE/client.crt" "$STATE/incus/client.crt"
  cp "$STATE/client.key" "$STATE/incus/client.key"
  cp "$STATE/cluster.crt" "$STATE/incus/servercerts/sbdc.crt"
  cat >"$STATE/incus/config.yml" <<EOF
default-remote: sbdc
remotes:
  sbdc:
    addr: https://$(mip 1):8443
    auth_type: tls
    project: default
    protocol: incus
    public: false
EOF
  chmod 600 "$STATE/incus/client.key"
}

# --- base image -----------------------------------------------------------------------
base_image() {
  local want have tar n out
  want=$(incus image info "$BASE_ALIAS" | awk '/^Fingerprint:/ {print $2}')
  have=$(mx 1 incus image info "$BASE_ALIAS" 2>/dev/null | awk '/^Fingerprint:/ {print $2}' || true)
  if [[ $have != "$want" ]]; then
    tar=$(compgen -G "$BASE_CACHE/$BASE_ALIAS-v*.tar" | head -n1)
    step "importing $(basename "$tar") into the cluster as $BASE_ALIAS"
    [[ -n $have ]] && mx 1 incus image alias delete "$BASE_ALIAS"
    if mx 1 incus image info "$want" >/dev/null 2>&1; then
      mx 1 incus image alias create "$BASE_ALIAS" "$want"
    else
      mx 1 incus image import "/var/cache/sandboxd-host/$(basename "$tar")" --alias "$BASE_ALIAS" >/dev/null
    fi
    # The image it replaces goes.
    [[ -z $have ]] || mx 1 incus image delete "$have" 2>/dev/null || true
    have=$(mx 1 incus image info "$BASE_ALIAS" | awk '/^Fingerprint:/ {print $2}')
    [[ $have == "$want" ]] || log "  warning: the cluster's $BASE_ALIAS is $have, the host's $want ($tar is not the host's image)"
    step_done
  fi
  # Unpacked on every member's pool once (incusd does it at an image's first
  # instance on a member, which would otherwise be the first sandbox's).
  # One member at a time: all three at once took as long (29 s) here.
  for n in "${MEMBERS[@]}"; do
    if ! mx 1 incus storage volume show "$POOL" "image/$have" --target "$(mname "$n")" >/dev/null 2>&1; then
      step "unpacking $BASE_ALIAS onto $(mname "$n")'s pool"
      mx 1 incus delete -f "sbdc-warm-$n" >/dev/null 2>&1 || true
      out=$(mx 1 incus init "$BASE_ALIAS" "sbdc-warm-$n" --target "$(mname "$n")" --no-profiles -s "$POOL" 2>&1) ||
        { echo "$out" >&2; exit 1; }
      mx 1 incus delete "sbdc-warm-$n"
      step_done
    fi
  done
}

# --- binaries and relays ------------------------------------------------------------
relay_unit() {
  cat <<EOF
[Unit]
Description=sandboxd relay (scripts/incus-cluster.sh)
After=incus.service systemd-networkd.service
Wants=incus.service
StartLimitIntervalSec=0

[Service]
EnvironmentFile=/etc/sandboxd-relay.env
ExecStart=$LIB/sandboxd relay --listen \${RELAY_ADDR}:8444 --cert /var/lib/incus/cluster.crt --key /var/lib/incus/cluster.key --client-cert $LIB/client.crt --sandbox-subnet $SANDBOX_SUBNET${RELAY_EGRESS_ALLOW:+ --egress-allow-cidr=$RELAY_EGRESS_ALLOW}
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
EOF
}

# Copies what changed; restarts the relay when anything did (or always with
# force=1).
binaries() {
  local force=${1:-0} n c f changed has_relay tmp
  for f in "$SANDBOXD_AGENT" "$SANDBOXD_BIN/sandboxd"; do
    [[ -x $f ]] || die "no $f: run make build (or set SANDBOXD_BIN, SANDBOXD_AGENT)"
  done
  has_relay=1
  if [[ $(timeout 5 "$SANDBOXD_BIN/sandboxd" relay --help 2>&1 || true) == *'unknown command'* ]]; then
    has_relay=0
    log "warning: $SANDBOXD_BIN/sandboxd has no relay subcommand yet: relays not started"
  fi
  tmp=$(mktemp -d)
  relay_unit >"$tmp/sandboxd-relay.service"
  cp "$STATE/client.crt" "$tmp/client.crt"
  cp "$SANDBOXD_AGENT" "$tmp/envd"
  cp "$SANDBOXD_BIN/sandboxd" "$tmp/"
  (cd "$tmp" && sha256sum envd sandboxd client.crt) >"$tmp/SUMS"
  for n in "${MEMBERS[@]}"; do
    c=$(ct "$n") changed=$force
    if ! mx "$n" sh -c "cd $LIB 2>/dev/null && sha256sum -c --status -" <"$tmp/SUMS" ||
      ! mx "$n" cmp -s /etc/systemd/system/sandboxd-relay.service - <"$tmp/sandboxd-relay.service"; then
      step "binaries to $c:$LIB (envd: $SANDBOXD_AGENT)"
      mx "$n" mkdir -p "$LIB"
      for f in envd sandboxd client.crt; do incus file push -q "$tmp/$f" "$c$LIB/$f.new"; done
      incus file push -q "$tmp/sandboxd-relay.service" "$c/etc/systemd/system/sandboxd-relay.service"
      mx "$n" sh -c "cd $LIB && chmod 755 envd.new sandboxd.new && chmod 644 client.crt.new &&
        for f in envd sandboxd client.crt; do mv -f \$f.new \$f; done && systemctl daemon-reload"
      changed=1
      step_done
    fi
    if ((has_relay)); then
      if ((changed)) || ! mx "$n" systemctl is-active -q sandboxd-relay; then
        mx "$n" systemctl enable -q sandboxd-relay
        mx "$n" systemctl restart sandboxd-relay
        log "relay on $c: $(mx "$n" systemctl is-active sandboxd-relay)"
      fi
    else
      mx "$n" systemctl disable -q --now sandboxd-relay 2>/dev/null || true
      mx "$n" systemctl reset-failed sandboxd-relay 2>/dev/null || true
    fi
  done
  rm -rf "$tmp"
}

write_env() {
  local n members=() tmp
  for n in "${MEMBERS[@]}"; do members+=("$(mname "$n")=$(mip "$n")"); done
  tmp=$(mktemp "$STATE/env.XXXXXX")
  cat >"$tmp" <<EOF
# scripts/incus-cluster.sh: the test cluster, for sandboxd's Incus backend.
# The host's incus CLI on it: INCUS_CONF=$STATE/incus incus cluster list
SANDBOXD_INCUS_URL=https://$(mip 1):8443
SANDBOXD_INCUS_CLIENT_CERT=$STATE/client.crt
SANDBOXD_INCUS_CLIENT_KEY=$STATE/client.key
SANDBOXD_INCUS_SERVER_CERT=$STATE/cluster.crt
SANDBOXD_CLUSTER_MEMBERS="${members[*]}"
EOF
  chmod 644 "$tmp"
  if cmp -s "$tmp" "$STATE/env"; then rm -f "$tmp"; else mv "$tmp" "$STATE/env"; fi
}

# Waits until the host's CLI sees member names "$@" ONLINE (all if none).
wait_online() {
  local want=("$@") i m out ok
  ((${#want[@]})) || for m in "${MEMBERS[@]}"; do want+=("$(mname "$m")"); done
  for ((i = 0; i < 600; i++)); do
    out=$(cx cluster list -f csv -c ns 2>/dev/null || true)
    ok=1
    # ONLINE, and answering a request forwarded to it: a member that
    # restarts within the offline threshold stays ONLINE, but answers
    # "Server isn't ready yet" for several seconds after its incusd does
    # locally.
    for m in "${want[@]}"; do
      grep -qx "$m,ONLINE" <<<"$out" && cx query "/1.0?target=$m" >/dev/null 2>&1 || ok=0
    done
    ((ok)) && return 0
    sleep 0.2
  done
  echo "$out" >&2
  die "members ${want[*]} not ONLINE"
}

# --- subcommands ---------------------------------------------------------------------
cmd_up() {
  local t0=$EPOCHREALTIME n
  if [[ ${1:-} == --binaries-only ]]; then
    for n in "${MEMBERS[@]}"; do running "$n" || die "$(ct "$n") is not running"; done
    binaries 1
    return
  fi
  [[ -z ${1:-} ]] || usage
  host_ready
  host_network
  member_image
  client_cert
  members
  bootstrap
  for n in "${MEMBERS[@]:1}"; do join "$n"; done
  cluster_config
  trust
  server_cert
  wait_online
  base_image
  binaries
  write_env
  log "up in $(since "$t0") s: $STATE/env"
}

cmd_down() {
  local t0=$EPOCHREALTIME n have
  for n in "${MEMBERS[@]}"; do
    if exists "$n"; then
      step "deleting $(ct "$n")"
      incus delete -f "$(ct "$n")"
      step_done
    fi
  done
  if incus network show "$NET" >/dev/null 2>&1; then
    step "deleting bridge $NET"
    incus network delete "$NET"
    step_done
  fi
  have=$(incus image info "$MEMBER_ALIAS" 2>/dev/null | awk '/^Fingerprint:/ {print $2}' || true)
  if [[ -n $have ]]; then
    step "deleting image $MEMBER_ALIAS"
    incus image delete "$have"
    step_done
  fi
  rm -rf "$STATE"
  log "down in $(since "$t0") s (cache $CACHE kept)"
}

cmd_status() {
  local n
  incus list '^sbdc-' -c nsN4 2>&1 || true
  if [[ -s $STATE/incus/config.yml ]]; then
    cx cluster list -c nusm 2>&1 || true
  fi
  for n in "${MEMBERS[@]}"; do
    if running "$n"; then
      echo "$(ct "$n"): incus $(mx "$n" systemctl is-active incus 2>/dev/null || true), relay $(mx "$n" systemctl is-active sandboxd-relay 2>/dev/null || true)"
    else
      echo "$(ct "$n"): not running"
    fi
  done
}

member_arg() {
  [[ ${1:-} =~ ^[123]$ ]] || die "member number 1, 2 or 3 expected"
}

cmd_stop() {
  member_arg "${1:-}"
  local t0=$EPOCHREALTIME
  incus stop -f "$(ct "$1")"
  log "$(ct "$1") stopped in $(since "$t0") s"
}

cmd_start() {
  member_arg "${1:-}"
  local n=$1 t0=$EPOCHREALTIME
  running "$n" || incus start "$(ct "$n")"
  wait_incusd "$n"
  log "$(ct "$n"): incusd answers after $(since "$t0") s"
  wait_online "$(mname "$n")"
  log "$(mname "$n") ONLINE and answering after $(since "$t0") s"
  if mx "$n" systemctl is-enabled -q sandboxd-relay 2>/dev/null; then
    local i
    for ((i = 0; i < 50; i++)); do mx "$n" systemctl is-active -q sandboxd-relay && break; sleep 0.2; done
    log "relay on $(ct "$n"): $(mx "$n" systemctl is-active sandboxd-relay || true)"
  fi
}

[[ $(id -u) == 0 ]] || die "must run as root"
export DEBIAN_FRONTEND=noninteractive
cmd=${1:-}
shift || true
# One of these at a time (status and env excepted).
case $cmd in up | down | stop | start | push | image)
  exec 9>/run/sandboxd-cluster.lock
  flock 9
  ;;
esac
case $cmd in
up) cmd_up "$@" ;;
push) cmd_up --binaries-only ;;
image) [[ -s $MEMBER_TAR && -s $MEMBER_TAR.sha256 ]] || build_member_image ;;
down) cmd_down ;;
status) cmd_status ;;
stop) cmd_stop "$@" ;;
start) cmd_start "$@" ;;
env) [[ -s $STATE/env ]] || die "no $STATE/env: run $0 up"; cat "$STATE/env" ;;
*) usage ;;
esac
