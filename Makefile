# sandboxd: see README.md. Every target works from a fresh clone as root.
SHELL := /bin/bash
GO    ?= go
BIN   := bin

# Each test target runs under scripts/stage.sh, which times it and, when
# STAGE_LOG names a file (.ci/run sets it), records its duration and result
# there for the table at the end of a CI run.
STAGE := ./scripts/stage.sh

# rustup's cargo, where a shell has not sourced ~/.cargo/env.
ifneq ($(wildcard $(HOME)/.cargo/bin/cargo),)
export PATH := $(HOME)/.cargo/bin:$(PATH)
endif

# What the test targets below build first (the binaries and the base
# template, or the guests' binaries), unless BUILT is set
# (test-vms-beside-compat, which built them already).
TESTED_BUILD = $(if $(BUILT),,build base)

.PHONY: all build base deps envd envd-rs code-interpreter sandboxd sandboxd-init sandboxd-spawn vm-bin generate run run-envd test test-envd-agents test-vms-beside-compat test-deploy test-go test-compat test-compat-envd-go test-compat-domain test-compat-latest test-compat-incus test-cluster test-schema test-cgroup test-cgroup2 test-cgroup1 cgroup-vm-v2 cgroup-vm-v1 cgroup-vm-v1-then-envd-rs vet fmt bench clean

all: build

build: envd envd-rs code-interpreter sandboxd sandboxd-init sandboxd-spawn

# The Debian packages the cgo builds need (gcc, libc6-dev, libseccomp-dev,
# pkg-config) and the local backend runs (nftables, iproute2): installed
# when missing and root, named when not (scripts/deps.sh).
deps:
	./scripts/deps.sh build

# envd is static (no cgo) so the same binary runs inside any template.
envd:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/envd ./cmd/envd

# envd-rs: the same agent without a Go runtime (docs/agent-rust.md), static
# like envd; `sandboxd serve` runs it in every sandbox where it was built
# (envd otherwise, or with --envd bin/envd). Its crates come from
# crates.io, pinned by envd-rs/Cargo.lock. Without cargo (rustup) it is
# left out, loudly, and sandboxes run envd.
envd-rs:
	@if command -v cargo >/dev/null; then \
		target=$$(rustc -vV | sed -n 's/^host: //p') && \
		RUSTFLAGS="-C target-feature=+crt-static" cargo build -q --release --locked --target "$$target" \
			--manifest-path envd-rs/Cargo.toml --target-dir envd-rs/target && \
		mkdir -p $(BIN) && cp "envd-rs/target/$$target/release/envd-rs" $(BIN)/envd-rs; \
	else \
		echo "!!! make envd-rs: no cargo on PATH: bin/envd-rs is not built, sandboxes run envd (install Rust with rustup)" >&2; \
		if [[ "$${CI:-}" == true ]]; then echo "!!! CI=true: failing" >&2; exit 1; fi; \
	fi

# The code-interpreter-v1 template's server (cmd/code-interpreter): static,
# like envd; sandboxd copies it into the template it builds.
code-interpreter:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/code-interpreter ./cmd/code-interpreter

# sandboxd needs cgo (libcontainer's nsenter) and libseccomp (the seccomp
# profile of local sandboxes); see runtime/local/DEPS.md.
sandboxd: deps
	CGO_ENABLED=1 $(GO) build -tags seccomp -trimpath -o $(BIN)/sandboxd ./cmd/sandboxd

# The local backend's helper, beside sandboxd: it starts the sandboxes and is
# their init's re-exec, a small binary instead of sandboxd (package
# runtime/local/starter). Static (libseccomp.a from libseccomp-dev, libc.a
# from libc6-dev), since every start pays the dynamic loader's work on it:
# 1-2 ms of a create through the API, with the helper, against 0.7-1 ms
# dynamic (BENCHMARKS.md).
sandboxd-init: deps
	CGO_ENABLED=1 $(GO) build -tags seccomp,netgo,osusergo -trimpath -ldflags '-linkmode external -extldflags "-static"' -o $(BIN)/sandboxd-init ./cmd/sandboxd-init

# The local backend's start of a sandbox (runtime/local/spawn): a small C
# program, static so that its exec at every create loads no library. The
# flags are runtimetest.BuildSpawn's, which the tests build it with.
sandboxd-spawn: deps
	$(CC) -O2 -Wall -Werror -static -o $(BIN)/sandboxd-spawn cmd/sandboxd-spawn/spawn.c

generate:
	./scripts/generate.sh

# The root filesystem of the template base (Debian bookworm with Python,
# Node and npm, git, curl, sudo …) from Debian packages, for both backends:
# built once (8-15 min, mostly downloads and dpkg), then cached under
# /var/cache/sandboxd/base (scripts/base-rootfs.sh).
base:
	./scripts/base-rootfs.sh >/dev/null

# Serve sandboxd on the local backend at 127.0.0.1:3000 and print the three
# exports an E2B SDK needs.
run: build base
	./scripts/run.sh

# envd alone on localhost:49983, for E2B's SDKs in debug mode.
run-envd: envd
	./scripts/run-envd.sh

# One command for everything; with -k every stage runs even after a failure,
# and the exit status is still non-zero. The Go tests and schemathesis run
# alone (they keep both cores busy); then the cgroup VMs, side by side
# (test-cgroup), run beside the SDK suites one after another
# (test-vms-beside-compat).
test: build base test-go test-schema test-envd-agents test-deploy test-vms-beside-compat

# The SDK suites beside the cgroup VMs: ≈ 35 min for all instead of ≈ 55
# one after the other. The VMs, which emulate their CPUs, run slower then;
# their tests' bounds on hangs stretch for it (SANDBOXD_TEST_SLOW, set by
# scripts/cgroup-vm.sh). `make test-cgroup` alone runs just the VMs. Their
# output is printed when they are done. Both sub-makes get BUILT=1: their
# targets then leave out their build prerequisites, which would otherwise
# rewrite binaries (bin/envd-rs, bin/sandboxd-spawn) the other side runs.
# (Three lanes, the cluster's stages beside the guests too, were tried at
# 30e2b6f: every stage ran with the CPUs 97-99 % busy, the v2 guest's tests
# ran out of their 43 minutes, and the run took 4005 s against 3849.)
test-vms-beside-compat: build base vm-bin envd-rs
	@vmlog=$$(mktemp -t cgroup-vms.XXXXXX); \
	$(MAKE) --no-print-directory BUILT=1 test-cgroup >"$$vmlog" 2>&1 & vms=$$!; \
	echo "=== the cgroup VMs run beside the SDK suites (their output follows the suites')"; \
	$(MAKE) --no-print-directory -k BUILT=1 test-compat test-compat-envd-go test-compat-domain test-compat-latest test-compat-incus test-cluster; compat=$$?; \
	wait $$vms; vm=$$?; cat "$$vmlog"; rm -f "$$vmlog"; \
	test $$compat -eq 0 && test $$vm -eq 0

# -timeout 30m: cmd/sandboxd's e2e tests took 16 min one at a time on 2 busy
# cores (now side by side, ≈ 7 min), over go test's default limit per
# package. The store's tests run on PostgreSQL
# too: scripts/postgres.sh starts a throwaway server and prints its DSN (a
# failure to start stops here, rather than the PostgreSQL variants skipping).
test-go: base
	dsn=$$(./scripts/postgres.sh up) && SANDBOXD_TEST_POSTGRES=$$dsn $(STAGE) go-test $(GO) test -race -tags seccomp -count=1 -timeout 30m ./...

# envd's HTTP-level Go tests (envd/internal/agenttest) against each agent
# binary in turn, bin/envd and bin/envd-rs: one set of assertions for both
# agents (test-go runs them in process). Only the packages with such tests:
# the others hold unit tests of Go internals and would report ok for
# running nothing. envd-rs-unit runs envd-rs's own unit tests (cargo test,
# a debug build: ≈ 45 s from nothing). Without bin/envd-rs (no cargo) the
# Rust half says so and passes.
ENVD_AGENT_PKGS := ./envd ./envd/internal/files ./envd/internal/filesystem ./envd/internal/process ./envd/internal/tunnel
test-envd-agents: envd envd-rs
	ENVD_TEST_BINARY=$(abspath $(BIN)/envd) $(STAGE) envd-agent-go $(GO) test -count=1 $(ENVD_AGENT_PKGS)
	@if [[ -x $(BIN)/envd-rs ]]; then \
		rc=0; \
		ENVD_TEST_BINARY=$(abspath $(BIN)/envd-rs) $(STAGE) envd-agent-rs $(GO) test -count=1 $(ENVD_AGENT_PKGS) || rc=1; \
		$(STAGE) envd-rs-unit cargo test -q --locked --manifest-path envd-rs/Cargo.toml --target-dir envd-rs/target || rc=1; \
		exit $$rc; \
	else \
		echo "!!! test-envd-agents: no bin/envd-rs (no cargo): envd's Go tests did NOT run against the Rust agent" >&2; \
	fi

# schemathesis over both OpenAPI specs against a real sandboxd: no 5xx but
# 501, every response as its spec says (scripts/schemathesis.sh).
test-schema: build base
	$(STAGE) schema ./scripts/schemathesis.sh

# docker-compose.yml, the systemd unit and the Grafana dashboard against
# compose-go, systemd-analyze and a real Prometheus scraping a real
# sandboxd (scripts/deploy-check.sh).
test-deploy: build base
	$(STAGE) deploy ./scripts/deploy-check.sh

test-compat: $(TESTED_BUILD)
	$(STAGE) compat-pinned ./compat-tests/run.sh

# The same suites with envd (Go) as every sandbox's agent, while it ships
# beside envd-rs (`sandboxd serve --envd bin/envd`); the other suites run
# the default, envd-rs where built. Debug mode whole (the SDKs against the
# agent alone); in sandboxd mode the files that exercise the agent:
# commands, files, PTY, watch, the wire, /init and envs, errors, lifecycle,
# metrics and snapshots. Template builds, the CLI, the code interpreter,
# network policy, volumes, quotas and MCP are sandboxd's and the backend's,
# which the other four suites test with the default agent; leaving them out
# here (and the code interpreter's build) saves ≈ 4 of the run's minutes.
# Without bin/envd-rs, envd is the default that test-compat ran whole.
ENVD_GO_JS_TESTS := commands.test.mjs errors.test.mjs files.test.mjs lifecycle.test.mjs metrics.test.mjs pty.test.mjs secure.test.mjs snapshots.test.mjs watch.test.mjs wire.test.mjs
ENVD_GO_PY_ARGS := tests/test_async.py tests/test_commands.py tests/test_errors.py tests/test_files.py tests/test_lifecycle.py tests/test_metrics_logs.py tests/test_pty.py tests/test_secure.py tests/test_snapshots.py tests/test_watch.py
test-compat-envd-go: $(TESTED_BUILD)
	@if [[ -x $(BIN)/envd-rs ]]; then \
		COMPAT_ENVD=$(BIN)/envd COMPAT_JS_TESTS="$(ENVD_GO_JS_TESTS)" COMPAT_PY_ARGS="$(ENVD_GO_PY_ARGS)" \
			COMPAT_SERVE_ARGS=--code-interpreter=off $(STAGE) compat-envd-go ./compat-tests/run.sh; \
	else \
		echo "test-compat-envd-go: no bin/envd-rs (no cargo): envd is the default agent, which test-compat ran" >&2; \
	fi

# The same suites against sandboxd reached by E2B_DOMAIN alone, as the SDKs'
# next major version reaches E2B: TLS with a test CA, host routing, *.localhost
# resolved by nss-myhostname (compat-tests/run.sh, domain mode).
test-compat-domain: $(TESTED_BUILD)
	COMPAT_TARGET=domain $(STAGE) compat-domain ./compat-tests/run.sh

# The same suites against sandboxd with the newest SDKs the registries serve,
# so a new E2B release that breaks compatibility shows up here first; a
# suite whose newest SDKs are the pinned ones is skipped (test-compat ran
# them).
test-compat-latest: $(TESTED_BUILD)
	COMPAT_TARGET=sandboxd E2B_SDK_VERSION=latest COMPAT_SKIP_IF_PINNED=1 $(STAGE) compat-latest ./compat-tests/run.sh

# The same suites against sandboxd on the Incus backend, when Incus
# answers (scripts/incus-setup.sh). Without Incus this says so loudly and
# passes, except in CI (CI=true), where it fails.
test-compat-incus: $(TESTED_BUILD)
	@if incus query /1.0 >/dev/null 2>&1; then \
		COMPAT_TARGET=incus $(STAGE) compat-incus ./compat-tests/run.sh; \
	else \
		echo "!!! test-compat-incus: Incus does not answer (incus query /1.0): the SDK suites did NOT run on the Incus backend; run scripts/incus-setup.sh" >&2; \
		if [[ "$${CI:-}" == true ]]; then echo "!!! CI=true: failing" >&2; exit 1; fi; \
	fi

# The Incus backend on a real three-member Incus cluster inside this machine
# (scripts/incus-cluster.sh: nested Incus in system containers, built on
# first use, ≈ 2 min, and left up): cmd/sandboxd's TestIncusClusterE2E
# (placement, a member killed and back, sandboxd restarted) and
# TestIncusClusterHA (two sandboxd on one PostgreSQL store, the active one
# killed; scripts/postgres.sh) and TestIncusClusterTemplates (a built
# template copied to every member), then the SDK
# suites through the members' relays (compat-tests/run.sh, cluster mode).
# The SDK suites leave out what the cluster does not change from one Incus
# host, which test-compat-incus runs whole: template builds through the SDKs
# and the CLI (the builder and the API are the same; what the cluster adds,
# one build copied to every member, is TestIncusClusterTemplates') and the
# code interpreter, whose template build at start goes too (its port's
# traffic through a relay is any port's, which lifecycle's proxy tests
# cover). On J (2026-12-08) the suites took 242 s (267 tests) this way,
# against 812 s whole (316 tests) in the same hour; 286 s in CI.
# Needs what test-compat-incus needs; without Incus it says so and passes,
# except in CI.
CLUSTER_JS_SKIP := template.test.mjs cli.test.mjs codeinterpreter.test.mjs
CLUSTER_PY_ARGS := --ignore=tests/test_template.py --ignore=tests/test_code_interpreter.py
test-cluster: $(TESTED_BUILD)
	@if incus query /1.0 >/dev/null 2>&1; then \
		$(STAGE) cluster-up ./scripts/incus-cluster.sh up && \
		SANDBOXD_TEST_POSTGRES=$$(./scripts/postgres.sh up) && export SANDBOXD_TEST_POSTGRES && \
		$(STAGE) cluster-e2e $(GO) test -tags seccomp -count=1 -timeout 20m -run 'TestIncusClusterE2E|TestIncusClusterHA|TestIncusClusterTemplates' -v ./cmd/sandboxd && \
		COMPAT_TARGET=cluster COMPAT_JS_SKIP="$(CLUSTER_JS_SKIP)" COMPAT_PY_ARGS="$(CLUSTER_PY_ARGS)" \
			COMPAT_SERVE_ARGS=--code-interpreter=off $(STAGE) compat-cluster ./compat-tests/run.sh; \
	else \
		echo "!!! test-cluster: Incus does not answer (incus query /1.0): nothing ran on an Incus cluster; run scripts/incus-setup.sh" >&2; \
		if [[ "$${CI:-}" == true ]]; then echo "!!! CI=true: failing" >&2; exit 1; fi; \
	fi

# runtime/local's cgroup-dependent tests in a VM that mounts only cgroup v2,
# or only v1 (this machine is hybrid): a Debian kernel from apt, the host's
# root read-only over 9p, no network device. Emulated (TCG) where /dev/kvm
# cannot boot a stock kernel, as on our 2-core machines. See
# scripts/cgroup-vm.sh (SANDBOXD_VM_TESTS=all runs every test of the
# package in the guest).
#
# vm-bin: the guests' test binary (runtime/local without -race), built once
# for both layouts, beside the envd, sandboxd-init and sandboxd-spawn they run.
vm-bin: envd sandboxd-init sandboxd-spawn
	CGO_ENABLED=1 $(GO) test -c -tags seccomp -o $(BIN)/local.test ./runtime/local/
	CGO_ENABLED=0 $(GO) test -c -o $(BIN)/envd-cgroup.test ./envd/internal/cgroup/

# Both layouts side by side: the tests run one at a time, so an emulated
# guest often keeps only one of its two vCPU threads busy, and the other
# guest uses the second host core meanwhile.
# -O: each guest's output comes whole, when it is done.
test-cgroup: $(if $(BUILT),,vm-bin envd-rs)
	$(STAGE) cgroup-vms $(MAKE) --no-print-directory -k -j2 -O cgroup-vm-v2 cgroup-vm-v1-then-envd-rs

# After the v1 guest (the shorter one), on its core: a v2 guest whose
# sandboxes run envd-rs, for the tests of each command's own cgroup, the
# pids reserve and fork bombs (≈ 2 min). Without bin/envd-rs it says so.
cgroup-vm-v1-then-envd-rs:
	@$(MAKE) --no-print-directory cgroup-vm-v1; v1=$$?; \
	if [[ -x $(BIN)/envd-rs ]]; then \
		d=$$(mktemp -d) && cp $(BIN)/local.test $(BIN)/envd-cgroup.test $(BIN)/sandboxd-init $(BIN)/sandboxd-spawn "$$d/" && \
		cp $(BIN)/envd-rs "$$d/envd" && \
		SANDBOXD_VM_BIN=$$d SANDBOXD_VM_RUN='^(TestCgroupDelegation|TestForkBomb)$$' SANDBOXD_VM_SKIP= \
			$(STAGE) cgroup-v2-envd-rs ./scripts/cgroup-vm.sh v2; rs=$$?; rm -rf "$$d"; \
	else \
		echo "!!! cgroup-vm-v1-then-envd-rs: no bin/envd-rs (no cargo): envd-rs's cgroup tests did NOT run" >&2; rs=0; \
	fi; \
	test $$v1 -eq 0 && test $$rs -eq 0

test-cgroup2 test-cgroup1: test-cgroup%: vm-bin
	@$(MAKE) --no-print-directory cgroup-vm-v$*

# Without a prerequisite, so that test-cgroup's sub-make does not build again.
cgroup-vm-v2 cgroup-vm-v1: cgroup-vm-%:
	SANDBOXD_VM_BIN=$(BIN) $(STAGE) cgroup-$* ./scripts/cgroup-vm.sh $*

vet:
	$(GO) vet ./...

fmt:
	gofmt -l -w $$(git ls-files '*.go')

bench: build base
	@BENCH_SKIP_BUILD=1 ./bench/run.sh $(BENCH_ARGS)

clean:
	rm -rf $(BIN)
