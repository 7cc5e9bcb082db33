# sandboxd: see README.md. Every target works from a fresh clone as root.
SHELL := /bin/bash
GO    ?= go
BIN   := bin

.PHONY: all build deps envd sandboxd sandboxd-init generate run run-envd test test-go test-compat test-compat-latest test-compat-incus test-cgroup2 test-cgroup1 vet fmt bench clean

all: build

build: envd sandboxd sandboxd-init

# The Debian packages the cgo builds need (gcc, libc6-dev, libseccomp-dev,
# pkg-config) and the local backend runs (nftables, iproute2): installed
# when missing and root, named when not (scripts/deps.sh).
deps:
	./scripts/deps.sh build

# envd is static (no cgo) so the same binary runs inside any template.
envd:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/envd ./cmd/envd

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

generate:
	./scripts/generate.sh

# Serve sandboxd on the local backend at 127.0.0.1:3000 and print the three
# exports an E2B SDK needs.
run: build
	./scripts/run.sh

# envd alone on localhost:49983, for E2B's SDKs in debug mode.
run-envd: envd
	./scripts/run-envd.sh

test: build test-go test-schema test-cgroup2 test-cgroup1 test-compat test-compat-latest test-compat-incus

test-go:
	$(GO) test -race -tags seccomp -count=1 ./...

# schemathesis over both OpenAPI specs against a real sandboxd: no 5xx but
# 501, every response as its spec says (scripts/schemathesis.sh).
test-schema: build
	./scripts/schemathesis.sh

test-compat: build
	./compat-tests/run.sh

# The same suites against sandboxd with the newest SDKs the registries serve,
# so a new E2B release that breaks compatibility shows up here first.
test-compat-latest: build
	COMPAT_TARGET=sandboxd E2B_SDK_VERSION=latest ./compat-tests/run.sh

# The same suites against sandboxd on the Incus backend (issue 7), when Incus
# answers (scripts/incus-setup.sh). Without Incus this says so loudly and
# passes, except in CI (CI=true), where it fails.
test-compat-incus: build
	@if incus query /1.0 >/dev/null 2>&1; then \
		COMPAT_TARGET=incus ./compat-tests/run.sh; \
	else \
		echo "!!! test-compat-incus: Incus does not answer (incus query /1.0): the SDK suites did NOT run on the Incus backend; run scripts/incus-setup.sh" >&2; \
		if [[ "$${CI:-}" == true ]]; then echo "!!! CI=true: failing" >&2; exit 1; fi; \
	fi

# runtime/local's tests in a VM that mounts only cgroup v2, or only v1 (this
# machine is hybrid): a Debian kernel from apt, the host's root read-only
# over 9p, no network device. Emulated (TCG) where /dev/kvm cannot boot a
# stock kernel, as on our 2-core machines: 9-20 minutes each there. See
# scripts/cgroup-vm.sh.
test-cgroup2:
	./scripts/cgroup-vm.sh v2

test-cgroup1:
	./scripts/cgroup-vm.sh v1

vet:
	$(GO) vet ./...

fmt:
	gofmt -l -w $$(git ls-files '*.go')

bench: build
	@BENCH_SKIP_BUILD=1 ./bench/run.sh $(BENCH_ARGS)

clean:
	rm -rf $(BIN)
