#!/usr/bin/env bash
# `make test-cgroup2` / `make test-cgroup1`: run runtime/local's tests on a
# host whose cgroups are v2 only, or v1 only.
#
#   scripts/cgroup-vm.sh v2|v1
#   scripts/cgroup-vm.sh build DIR   # the binaries a guest runs, into DIR
#
# This machine mounts cgroups hybrid (v1 controllers, empty cgroup2), so the
# tests run here never see either pure layout. This script boots a guest on a
# Debian kernel (fetched with apt-get download, cached) and mounts only the
# layout asked for:
#   v2  cgroup_no_v1=all and cgroup2 alone at /sys/fs/cgroup, on the newest
#       kernel in the apt sources;
#   v1  each v1 hierarchy on its own directory of a tmpfs at /sys/fs/cgroup
#       (cpu,cpuacct and net_cls,net_prio joined, and name=systemd, as
#       systemd's legacy mode mounts them) and no cgroup2 anywhere, on apt's
#       candidate kernel (Debian 12's 6.1): from 6.12 on, Debian's kernels
#       have no v1 memory controller (CONFIG_MEMCG_V1 unset).
# The guest's root is this host's root, shared read-only over virtio-9p with
# a tmpfs overlay on top, so the guest runs the test binary built here
# against the host's /usr (the base template) without copying anything. The
# guest has no network device (-nic none): nothing it does leaves it.
#
# What runs: by default only the tests whose outcome depends on the cgroup
# layout (SANDBOXD_VM_TESTS=cgroup, the patterns below): every sandbox's
# cgroup set up and removed, limits (memory/OOM, pids, disk on tmpfs
# charged to memory), stats read from the cgroup files (memory, pids, CPU
# time and count), pause (freezer) and
# pause to disk, adoption of live and paused sandboxes by a new backend, the
# cgroup parent, favordynmods, failed and cancelled creates leaving no
# cgroup, the hierarchies a sandbox joins (and its destroy leaves in none,
# killing a process that joined from outside), the device rules,
# libcontainer's cgroup manager in sandboxd's own process, and the
# sandboxes' delegated cgroup2 subtree (v2 only).
# Everything else (OCI import, egress, seccomp, mounts, user-namespace
# mapping, the conformance suite's isolation, error and port cases) does not
# touch the cgroup layout and runs on the host in `make test-go`, whose hybrid
# layout drives the v1 controllers. SANDBOXD_VM_TESTS=all runs every test.
#
# Output: the test binary's -test.v output on the serial console, then its
# top-level PASS/FAIL lines. Exit status: the tests', or 1 when the guest
# never reported one (boot failure, timeout). Without a KVM that boots a
# stock kernel, qemu emulates the CPU (TCG): every test of the package took
# 9-20 minutes on 2 cores, depending on the host's speed that day; the
# cgroup-dependent ones are about half of that (README, "Testing").
#
# Environment:
#   SANDBOXD_VM_TESTS    cgroup (default) or all, see above
#   SANDBOXD_VM_RUN      -test.run pattern (default: SANDBOXD_VM_TESTS's)
#   SANDBOXD_VM_SKIP     -test.skip pattern (default: SANDBOXD_VM_TESTS's;
#                        set it empty to skip nothing)
#   SANDBOXD_VM_BIN      a directory with local.test, envd-cgroup.test, envd, sandboxd-init
#                        and sandboxd-spawn
#                        built already (`build DIR`, or make vm-bin: bin/),
#                        so that both layouts share one build; default: build
#                        them for this run
#   SANDBOXD_VM_ARGS     more test binary flags, e.g. -test.count=3
#   SANDBOXD_VM_TIMEOUT  seconds before the guest is killed (default 3300: the
#                        emulated guests took 1100-1800 s on a 2-core host,
#                        depending on its load, and run beside the SDK
#                        suites in make test)
#   SANDBOXD_VM_BOOT_TIMEOUT  seconds the guest may take to its first line
#                        before it is killed and booted once more (default 300;
#                        9 s on a quiet 2-core host)
#   SANDBOXD_VM_SILENCE  seconds the tests may print nothing before the guest
#                        sends them SIGQUIT (their stacks, then a failure);
#                        300 s more of silence and the host kills the guest
#                        and boots it once more (default 900; the longest
#                        v2 run here printed every test and subtest as it began,
#                        1323 s in all)
#   SANDBOXD_VM_MEM      guest memory (default 3G); SANDBOXD_VM_CPUS (default 2)
#   SANDBOXD_VM_CACHE    kernel cache (default /var/cache/sandboxd-vm)
#   SANDBOXD_VM_KERNEL   newest or candidate: which linux-image-amd64 (default:
#                        newest for v2, candidate for v1)
#   SANDBOXD_VM_ACCEL    kvm or tcg (default: kvm where the CPU has VMX/SVM)
#   SANDBOXD_VM_TCG_CPU  the CPU model qemu emulates under TCG (default
#                        qemu64: a subset of the v2 guest's tests ran 20 %
#                        faster on it than on max, whose AVX and other
#                        extensions the guest's kernel and libraries use and
#                        TCG emulates slowly; machine G, 2026-12-06)
#   SANDBOXD_VM_CMDLINE  more kernel parameters for the guest
#   SANDBOXD_VM_DEBUG=1  kernel messages on the console
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${SANDBOXD_VM_CACHE:-/var/cache/sandboxd-vm}
timeout_s=${SANDBOXD_VM_TIMEOUT:-3300}
silence_s=${SANDBOXD_VM_SILENCE:-900}
mem=${SANDBOXD_VM_MEM:-3G}
cpus=${SANDBOXD_VM_CPUS:-2}
extra_args=${SANDBOXD_VM_ARGS:-}
layout=${1:-}

say() { echo "cgroup-vm${layout:+ $layout}: $*" >&2; }

# build DIR: the test binary of runtime/local (without -race: the guest
# emulates its CPU), envd, sandboxd-init and sandboxd-spawn as the guest runs them.
build() {
  mkdir -p "$1"
  (cd "$repo" &&
    CGO_ENABLED=1 go test -c -tags seccomp -o "$1/local.test" ./runtime/local/ &&
    CGO_ENABLED=0 go test -c -o "$1/envd-cgroup.test" ./envd/internal/cgroup/ &&
    CGO_ENABLED=1 go build -tags seccomp -trimpath -o "$1/sandboxd-init" ./cmd/sandboxd-init &&
    cc -O2 -Wall -Werror -static -o "$1/sandboxd-spawn" cmd/sandboxd-spawn/spawn.c &&
    CGO_ENABLED=0 go build -trimpath -o "$1/envd" ./cmd/envd)
}

case $layout in
v2) default_kernel=newest ;;
v1) default_kernel=candidate ;;
build)
  [[ -n ${2:-} ]] || { say "usage: $0 build DIR"; exit 2; }
  build "$2"
  exit
  ;;
*) say "usage: $0 v2|v1|build DIR"; exit 2 ;;
esac

# The cgroup-dependent tests (see the header). Of the conformance suite:
# all but the cases that create a sandbox only to look at its isolation,
# its API's errors, its port forwarding or the dev tools in it (every case
# still creates one, and its cleanup checks that no cgroup of it is left).
# Exec, the dev tools (npm, pip, git, cc, python, node), is the costliest
# case in an emulated guest, 150 s and more, and what it checks is the
# same on any cgroup layout; with the guest's CPU shared (the other guest,
# a busy host) its pip step ran into the case's 3-minute deadline. It runs
# on the host, in both user-namespace modes.
cgroup_run='^(TestConformance|TestRestart|TestRecovery|TestUserNSModeChange|TestTemplateResources|TestPauseToDiskFails|TestPauseToDiskNoRoom|TestResumeFromDiskFails|TestCloseCgroupParent|TestFavorDynMods|TestStartInProcess|TestStarterDies|TestContainerLoadFails|TestInitFailsLeavesNothing|TestCgroupDelegation|TestReconcileNestedStrayCgroup|TestForkBomb|TestBackgroundCreate|TestJoinCPUGroup|TestCgroupHierarchiesJoined|TestDestroyKillsEverything|TestDeviceRules)$'
cgroup_skip='^TestConformance$/./^(CreateErrors|DestroyTwice|List|DialPort|Isolation|Exec)$'
# The v1 guest runs fewer: the CI hosts are hybrid, so `make test-go` runs
# every one of these tests on the v1 controllers already. What only a pure
# v1 host has is no cgroup2 mount at all (no unified hierarchy beside the
# controllers, no favordynmods, no nsdelegate), which touches a sandbox's
# create, limits, stats, pause, leftovers, recovery and restart, and the
# delegation's absence; the guest's 6.1 kernel has no user namespace mode
# to test (tmpfs idmapping needs 6.3). The error paths, the starter's and
# the template resources' tests repeat the hybrid host's: left out, they
# give the v2 guest, the longest stage of make test, the second core sooner.
cgroup_run_v1='^(TestConformance|TestRestart|TestRecovery|TestCgroupDelegation|TestReconcileNestedStrayCgroup|TestForkBomb|TestPauseToDiskNoRoom|TestCgroupHierarchiesJoined|TestDestroyKillsEverything|TestDeviceRules|TestMemoryCgroupRecycled|TestMemcgSpares)$'
cgroup_skip_v1='^TestConformance$/./^(CreateErrors|DestroyTwice|List|DialPort|Isolation|Exec|Fork|Concurrency|CreateCancelled|CreateEnvdInit)$'
case ${SANDBOXD_VM_TESTS:-cgroup} in
cgroup)
  if [[ $layout == v1 ]]; then cgroup_run=$cgroup_run_v1 cgroup_skip=$cgroup_skip_v1; fi
  run_pattern=${SANDBOXD_VM_RUN-$cgroup_run}
  skip_pattern=${SANDBOXD_VM_SKIP-$cgroup_skip}
  ;;
all)
  run_pattern=${SANDBOXD_VM_RUN:-}
  skip_pattern=${SANDBOXD_VM_SKIP:-}
  ;;
*) say "SANDBOXD_VM_TESTS must be cgroup or all"; exit 1 ;;
esac

if [[ $(id -u) != 0 ]]; then
  say "needs root (apt-get, and the tests themselves)"; exit 1
fi

# The two layouts may be prepared side by side (make test-cgroup): one at a
# time installs packages (dpkg's lock) and fills the kernel cache.
mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

# Host tools: qemu, a static busybox for the initramfs, kmod for depmod and
# module dependencies (and, through the shared root, the guest's modprobe),
# cpio for the initramfs.
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[[ -x /bin/busybox && " $(/bin/busybox --list 2>/dev/null | tr '\n' ' ') " == *" switch_root "* ]] || need+=(busybox-static)
command -v depmod >/dev/null || need+=(kmod)
command -v cpio >/dev/null || need+=(cpio)
if ((${#need[@]})); then
  say "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null
fi
if [[ $(ldd /bin/busybox 2>&1) != *"not a dynamic"* ]]; then
  say "/bin/busybox is not static (install busybox-static)"; exit 1
fi

# The kernel: the linux-image-*-amd64 package that linux-image-amd64 depends
# on, in its newest version in this machine's apt sources (with
# SANDBOXD_VM_KERNEL=candidate: the version apt would install), unpacked
# once into the cache (a later run reads only the cache). The newest for v2
# because user namespaces need Linux >= 6.3 on a tmpfs Root (on Debian 12's
# own 6.1 the user-namespace tests skip); the candidate for v1, since the
# newest has no v1 memory controller.
case ${SANDBOXD_VM_KERNEL:-$default_kernel} in
newest) meta=$(apt-cache madison linux-image-amd64 2>/dev/null | awk '{print $3}' | sort -V | tail -1) ;;
candidate) meta=$(apt-cache policy linux-image-amd64 2>/dev/null | awk '$1 == "Candidate:" {print $2}') ;;
*) say "SANDBOXD_VM_KERNEL must be newest or candidate"; exit 1 ;;
esac
kpkg=
if [[ -n "$meta" && "$meta" != "(none)" ]]; then
  kpkg=$(apt-cache depends "linux-image-amd64=$meta" 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ {print $2; exit}')
fi
if [[ -z "$kpkg" ]]; then
  # No package index (offline): use the newest kernel already cached.
  kpkg=$(ls -1d "$cache"/linux-image-*/.done 2>/dev/null | sort -V | tail -1 | xargs -r dirname | xargs -r basename)
fi
[[ -n "$kpkg" ]] || { say "no linux-image-amd64 in the apt sources and no cached kernel"; exit 1; }
kver=${kpkg#linux-image-}
kdir=$cache/$kpkg
if [[ ! -e $kdir/.done ]]; then
  say "fetching $kpkg"
  mkdir -p "$cache"
  dl=$(mktemp -d "$cache/dl.XXXXXX")
  trap 'rm -rf "$dl"' EXIT
  chown _apt "$dl" 2>/dev/null || true # apt-get download drops to _apt
  # The image package's newest version: the one the chosen linux-image-amd64
  # names (a package name carries its ABI, so versions of one name differ
  # only by Debian revision).
  kpkgver=$(apt-cache madison "$kpkg" | awk '{print $3}' | sort -V | tail -1)
  (cd "$dl" && apt-get download "$kpkg=$kpkgver" >/dev/null)
  rm -rf "$kdir"
  dpkg-deb -x "$dl"/*.deb "$kdir"
  depmod -b "$kdir" "$kver"
  rm -rf "$dl"
  trap - EXIT
  touch "$kdir/.done"
fi
kmods=$kdir/lib/modules/$kver
exec 9>&-

work=$(mktemp -d "$cache/run.XXXXXX")
trap 'rm -rf "$work"' EXIT

# What the guest runs, in $work, which the guest sees through the shared
# root: built here, or copied from SANDBOXD_VM_BIN (the guest has fresh
# tmpfs on /tmp, /run and /var/tmp, and a copy cannot change under it).
if [[ -n ${SANDBOXD_VM_BIN:-} ]]; then
  for f in local.test envd-cgroup.test envd sandboxd-init sandboxd-spawn; do
    [[ -x $SANDBOXD_VM_BIN/$f ]] || { say "$SANDBOXD_VM_BIN/$f is missing (make vm-bin)"; exit 1; }
    cp "$SANDBOXD_VM_BIN/$f" "$work/$f"
  done
else
  say "building the runtime/local test binary, envd, sandboxd-init and sandboxd-spawn"
  build "$work"
fi

# The initramfs: busybox, the modules that reach the shared root (virtio-pci,
# 9p, overlay) and an init that mounts it. Everything else (veth, nftables)
# the guest's kernel loads on demand from $kmods, bound at /lib/modules.
ir=$work/initramfs
mkdir -p "$ir"/{bin,dev,proc,sys,mnt/lower,mnt/rw,newroot,modules}
cp /bin/busybox "$ir/bin/busybox"
ln -s busybox "$ir/bin/sh"
: >"$ir/modules.list"
for m in virtio_pci 9pnet_virtio 9p overlay; do
  modprobe -d "$kdir" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  cp "$ko" "$ir/modules/"
  echo "/modules/$(basename "$ko")" >>"$ir/modules.list"
done

# KVM where /dev/kvm exists and the CPU has VMX/SVM. This machine's
# /dev/kvm is PVM (kvm_pvm, nested_pvm=1: a Firecracker guest without VMX):
# it runs only guest kernels built for PVM, and a stock kernel hangs right
# after its boot stub ("Probing EDD ... ok", then nothing). Elsewhere qemu
# emulates the CPU (TCG): slower, the same kernel and cgroup code.
accel=${SANDBOXD_VM_ACCEL:-}
if [[ -z "$accel" ]]; then
  if [[ -c /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo; then accel=kvm; else accel=tcg; fi
fi
case $accel in
kvm) accel_args=(-enable-kvm -cpu host) ;;
tcg)
  why="the CPU has no VMX/SVM"
  [[ -c /dev/kvm ]] || why="no /dev/kvm"
  [[ -d /sys/module/kvm_pvm ]] && why="/dev/kvm is PVM (kvm_pvm), which boots only PVM-built guest kernels"
  say "$why: emulating the guest's CPU (TCG, much slower than KVM)"
  accel_args=(-accel tcg,thread=multi -cpu "${SANDBOXD_VM_TCG_CPU:-qemu64}")
  ;;
*) say "SANDBOXD_VM_ACCEL must be kvm or tcg"; exit 1 ;;
esac
cat >"$ir/vm.env" <<EOF
KVER='$kver'
KMODS='$kmods'
WORK='$work'
PKGDIR='$repo/runtime/local'
LAYOUT='$layout'
RUN_PATTERN='$run_pattern'
SKIP_PATTERN='$skip_pattern'
EXTRA_ARGS='$extra_args'
TIMEOUT='$((timeout_s - 720))s'
SILENCE_S='$silence_s'
EOF

cat >"$ir/init" <<'EOF'
#!/bin/sh
# Stage 1 (busybox, in the initramfs): the host's root read-only over 9p,
# a tmpfs overlay on it, and the cgroup layout asked for.
export PATH=/bin
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() { echo "SANDBOXD-VM: stage 1: $*"; echo "SANDBOXD-VM-RESULT 99"; poweroff -f; }
. /vm.env
for ko in $(cat /modules.list); do insmod "$ko" || fail "insmod $ko"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=524288,access=any hostroot /mnt/lower || fail "mount 9p"
mount -t tmpfs -o mode=0755 rw /mnt/rw
mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay -o lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work overlay /newroot || fail "mount overlay"
r=/newroot
mount -t proc proc $r/proc
mount -t sysfs sysfs $r/sys
mount -t devtmpfs devtmpfs $r/dev
mkdir -p $r/dev/pts $r/dev/shm $r/dev/mqueue
mount -t devpts -o newinstance,ptmxmode=0666 devpts $r/dev/pts
mount -t tmpfs -o mode=1777 shm $r/dev/shm
mount -t mqueue mqueue $r/dev/mqueue
if [ "$LAYOUT" = v2 ]; then
  mount -t cgroup2 -o nsdelegate cgroup2 $r/sys/fs/cgroup || fail "mount cgroup2"
else
  # systemd's legacy layout: one hierarchy per controller (cpu with cpuacct,
  # net_cls with net_prio), name=systemd, and no cgroup2.
  mount -t tmpfs -o mode=0755 cgroup $r/sys/fs/cgroup
  for h in $(awk 'NR > 1 && $4 == 1 {print $1}' /proc/cgroups | sed 's/^cpu$/cpu,cpuacct/; /^cpuacct$/d; s/^net_cls$/net_cls,net_prio/; /^net_prio$/d'); do
    mkdir $r/sys/fs/cgroup/$h
    # A controller this kernel cannot mount alone is left out (the tests
    # say what they miss); the ones sandboxes use are checked below.
    mount -t cgroup -o $h cgroup $r/sys/fs/cgroup/$h || { echo "SANDBOXD-VM: cannot mount cgroup $h"; rmdir $r/sys/fs/cgroup/$h; }
  done
  ln -s cpu,cpuacct $r/sys/fs/cgroup/cpu
  ln -s cpu,cpuacct $r/sys/fs/cgroup/cpuacct
  ln -s net_cls,net_prio $r/sys/fs/cgroup/net_cls
  ln -s net_cls,net_prio $r/sys/fs/cgroup/net_prio
  mkdir $r/sys/fs/cgroup/systemd
  mount -t cgroup -o none,name=systemd cgroup $r/sys/fs/cgroup/systemd || fail "mount cgroup name=systemd"
  for h in cpu,cpuacct cpuset memory pids devices freezer; do
    grep -q " /newroot/sys/fs/cgroup/$h cgroup " /proc/mounts || fail "no v1 $h hierarchy"
  done
fi
for d in run tmp var/tmp; do mount -t tmpfs -o mode=0755 tmpfs $r/$d; done
chmod 1777 $r/tmp $r/var/tmp
mkdir -p $r/lib/modules/$KVER $r/run/sandboxd-vm
mount --bind $r$KMODS $r/lib/modules/$KVER
cp /vm.env /stage2 $r/run/sandboxd-vm/
cp /bin/busybox $r/run/sandboxd-vm/busybox
exec switch_root $r /run/sandboxd-vm/busybox sh /run/sandboxd-vm/stage2
EOF

cat >"$ir/stage2" <<'EOF'
# Stage 2, in the shared root: the host's tools, this guest's kernel.
export PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
bb=/run/sandboxd-vm/busybox
. /run/sandboxd-vm/vm.env
echo "SANDBOXD-VM: kernel $(uname -r); cgroup mounts: $(awk '$3 ~ /^cgroup/ {printf "%s %s; ", $2, $3}' /proc/mounts)"
if [ "$LAYOUT" = v2 ]; then
  # The root cgroup's controllers, delegated to children (libcontainer
  # enables them further down as it creates the sandboxes' cgroups).
  for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
    echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || echo "SANDBOXD-VM: cannot enable $c"
  done
  echo "SANDBOXD-VM: subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control)"
elif grep -q cgroup2 /proc/mounts; then
  echo "SANDBOXD-VM: a cgroup2 mount in a v1-only guest"
  echo "SANDBOXD-VM-RESULT 98"
  $bb poweroff -f
fi
ip link set lo up
cd "$PKGDIR"
set -- -test.v -test.timeout "$TIMEOUT"
[ -n "$RUN_PATTERN" ] && set -- "$@" -test.run "$RUN_PATTERN"
[ -n "$SKIP_PATTERN" ] && set -- "$@" -test.skip "$SKIP_PATTERN"
set -- "$@" $EXTRA_ARGS
# envd from the guest's memory: every backend the tests open copies it
# (runtime/local's copyEnvd), and over 9p in an emulated guest a copy took
# the better part of a second, each time.
$bb cp "$WORK/envd" /run/sandboxd-vm/envd
# envd's own cgroup tree (each command in a cgroup, a pids reserve): its
# pids cases need a cgroup2 with controllers, which the hybrid host lacks.
(cd /run/sandboxd-vm && "$WORK/envd-cgroup.test" -test.v -test.timeout 600s 2>&1)
cgrc=$?
# SANDBOXD_TEST_SLOW: the bounds that catch hangs (runtimetest.Within)
# stretched for an emulated CPU shared with the host's other stages.
# A test that prints nothing for SILENCE_S seconds hangs: SIGQUIT makes Go
# print every goroutine's stack and exit, so the log says where. (The host
# kills a guest silent for longer still: a hung kernel.)
out=/run/sandboxd-vm/local.out
SANDBOXD_TEST_SLOW=4 SANDBOXD_ENVD=/run/sandboxd-vm/envd SANDBOXD_INIT=$WORK/sandboxd-init SANDBOXD_SPAWN=$WORK/sandboxd-spawn "$WORK/local.test" "$@" >$out 2>&1 &
pid=$!
# coreutils tail (busybox sh would run its own applet, which has no --pid)
/usr/bin/tail -n +1 -s 1 -f --pid=$pid $out &
tailpid=$!
last=-1 quiet=0
while kill -0 $pid 2>/dev/null; do
  $bb sleep 10
  size=$($bb stat -c %s $out)
  if [ "$size" = "$last" ]; then quiet=$((quiet + 10)); else quiet=0 last=$size; fi
  if [ $quiet -ge "$SILENCE_S" ]; then
    echo "SANDBOXD-VM: no output from the tests in ${SILENCE_S}s: SIGQUIT for their goroutines' stacks"
    kill -QUIT $pid
    quiet=-1000000
  fi
done
wait $pid
rc=$?
wait $tailpid
[ $rc -eq 0 ] && rc=$cgrc
echo "SANDBOXD-VM-RESULT $rc"
sync
$bb poweroff -f
EOF

chmod +x "$ir/init"
(cd "$ir" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$work/initramfs.gz"

cmdline="console=ttyS0 panic=-1 rdinit=/init"
if [[ $layout == v2 ]]; then cmdline+=" cgroup_no_v1=all"; fi
if [[ "${SANDBOXD_VM_DEBUG:-}" != 1 ]]; then cmdline+=" quiet loglevel=1"; fi
cmdline+=${SANDBOXD_VM_CMDLINE:+ $SANDBOXD_VM_CMDLINE}

log=$work/console.log
say "booting $kpkg ($accel, $cpus vCPUs, $mem, timeout ${timeout_s}s; tests ${SANDBOXD_VM_TESTS:-cgroup}${run_pattern:+, run $run_pattern}${skip_pattern:+, skip $skip_pattern})"
start=$(date +%s)
# boot LIMIT: one run of the guest, killed after LIMIT seconds, or after
# boot_s seconds without stage 2's first line. An emulated guest has hung
# at its boot once in many CI runs (not a line in 3300 s, the whole
# timeout); the watchdog turns that into one retry of a few minutes.
# Status 3: the guest never spoke. Status 4: its kernel oopsed before the
# tests reported (an emulated guest once hit an int3 in the kernel's own
# code patching, in get_page_from_freelist, 2026-12-04); that earns the
# same one retry, and a second failure fails the stage. Status 5: the guest
# spoke, then nothing for silence_s + 300 seconds (a v1 guest went quiet
# 7 s into TestCgroupDelegation and stayed so until the timeout, 54 min
# later, 2026-12-05): the guest's own watchdog (SILENCE_S) would have had
# the tests print their stacks and end by then, so its kernel hangs; the
# same one retry.
boot() {
  : >"$log"
  rm -f "$work/qemu.pid"
  # -nic none: no network device at all. -no-reboot: a panic ends qemu too.
  timeout --kill-after=10 "$1" qemu-system-x86_64 \
    "${accel_args[@]}" -machine q35 -smp "$cpus" -m "$mem" \
    -kernel "$kdir/boot/vmlinuz-$kver" -initrd "$work/initramfs.gz" -append "$cmdline" \
    -virtfs "local,path=/,mount_tag=hostroot,readonly=on,security_model=none,multidevs=remap" \
    -nic none -display none -monitor none -serial stdio -no-reboot -pidfile "$work/qemu.pid" \
    </dev/null 2>"$work/qemu.err" | sed -u 's/\r$//' | tee "$log" &
  local run=$! t0 spoke= silent= size last=-1 heard
  t0=$(date +%s)
  heard=$t0
  while kill -0 "$run" 2>/dev/null; do
    if [[ -z "$spoke" ]] && grep -q '^SANDBOXD-VM' "$log"; then
      spoke=1
      say "the guest's first line after $(($(date +%s) - t0))s"
    fi
    size=$(stat -c %s "$log")
    if ((size != last)); then last=$size heard=$(date +%s); fi
    if [[ -z "$spoke" ]] && (($(date +%s) - t0 >= boot_s)); then
      say "no line from the guest in ${boot_s}s: killing it"
      kill_guest
      break
    fi
    if [[ -n "$spoke" ]] && (($(date +%s) - heard >= silence_s + 300)); then
      say "nothing from the guest in $((silence_s + 300))s: killing it"
      silent=1
      kill_guest
      break
    fi
    sleep 5
  done
  wait "$run" || true
  if [[ -z "$spoke" ]] && ! grep -q '^SANDBOXD-VM' "$log"; then return 3; fi
  if [[ -n "$silent" ]] && ! grep -q '^SANDBOXD-VM-RESULT ' "$log"; then return 5; fi
  if ! grep -q '^SANDBOXD-VM-RESULT ' "$log" && grep -qE '^\[ *[0-9.]+\] (Oops|Kernel panic)' "$log"; then
    return 4
  fi
  return 0
}
kill_guest() {
  kill "$(cat "$work/qemu.pid" 2>/dev/null)" 2>/dev/null ||
    pkill -f -- "-pidfile $work/qemu.pid" || true
}
boot_s=${SANDBOXD_VM_BOOT_TIMEOUT:-300}
boot "$timeout_s" || st=$?
if ((${st:-0} != 0)); then
  left=$((timeout_s - ($(date +%s) - start)))
  if ((left > boot_s)); then
    why="the guest never spoke"
    ((st == 4)) && why="the guest's kernel oopsed before a result: $(grep -m1 -E '^\[ *[0-9.]+\] (Oops|Kernel panic)' "$log")"
    ((st == 5)) && why="the guest went silent (a hung kernel)"
    say "$why; booting again (${left}s left; the first run's console is above)"
    boot "$left" || true
  fi
fi
took=$(($(date +%s) - start))

if [[ -s "$work/qemu.err" ]]; then say "qemu said:"; sed 's/^/  /' "$work/qemu.err" >&2; fi
echo
echo "=== cgroup-vm $layout summary ($kpkg, ${took}s) ==="
grep -E '^(--- (PASS|FAIL|SKIP): [^ ]+ |PASS$|FAIL$|panic: )' "$log" | grep -v '^    ' || true
rc=$(sed -n 's/^SANDBOXD-VM-RESULT \([0-9]*\)$/\1/p' "$log" | tail -1)
if [[ -z "$rc" ]]; then
  say "FAIL: the guest reported no result (boot failure or timeout after ${took}s; SANDBOXD_VM_DEBUG=1 shows the kernel's messages)"
  exit 1
fi
if [[ "$rc" != 0 ]]; then say "FAIL: tests exited $rc"; exit "$rc"; fi
say "ok: runtime/local's ${SANDBOXD_VM_TESTS:-cgroup} tests passed with cgroup $layout only ($kpkg) in ${took}s"
