# sandboxd: see README.md. Every target works from a fresh clone as root.
SHELL := /bin/bash
GO    ?= go
BIN   := bin

.PHONY: all build envd generate run test test-go test-compat vet fmt bench clean

all: build

build: envd

# envd is static (no cgo) so the same binary runs inside any template.
envd:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o $(BIN)/envd ./cmd/envd

generate:
	./scripts/generate.sh

# Until the control plane lands, `make run` serves envd standalone on
# localhost:49983, which E2B's SDKs reach in debug mode.
run: build
	./scripts/run-envd.sh

test: build test-go test-compat

test-go:
	$(GO) test -race -count=1 ./...

test-compat: build
	./compat-tests/run.sh

vet:
	$(GO) vet ./...

fmt:
	gofmt -l -w $$(git ls-files '*.go')

bench: build
	./bench/run.sh

clean:
	rm -rf $(BIN)
