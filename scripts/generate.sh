#!/usr/bin/env bash
# Regenerates every generated file in the repository. Plugin versions are pinned
# by the tool directives in go.mod; protoc comes from Debian (protobuf-compiler).
set -euo pipefail
cd "$(dirname "$0")/.."
plugins=$(mktemp -d)
trap 'rm -rf "$plugins"' EXIT
go build -o "$plugins/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$plugins/protoc-gen-connect-go" connectrpc.com/connect/cmd/protoc-gen-connect-go

# envd's wire contract: envd/api/spec/*.proto -> envd/api/<service> (messages) and
# envd/api/<service>/<service>connect (Connect clients and handlers).
rm -rf envd/api/process envd/api/filesystem
for proto in envd/api/spec/process/process.proto envd/api/spec/filesystem/filesystem.proto; do
  protoc -I envd/api/spec -I /usr/include \
    --plugin=protoc-gen-go="$plugins/protoc-gen-go" \
    --plugin=protoc-gen-connect-go="$plugins/protoc-gen-connect-go" \
    --go_out=envd/api --go_opt=module=github.com/sandboxd/sandboxd/envd/api \
    --connect-go_out=envd/api --connect-go_opt=module=github.com/sandboxd/sandboxd/envd/api \
    "${proto#envd/api/spec/}"
done

# E2B control-plane REST server: openapi/e2b.yaml -> openapi/e2bapi/e2b.gen.go (chi + strict
# server, models). oapi-codegen is pinned by the tool directive in go.mod.
go tool oapi-codegen -config openapi/e2b.cfg.yaml openapi/e2b.yaml

# sandboxd's native API: openapi/native.yaml -> openapi/nativeapi/native.gen.go (chi server
# wrapper, models); server/native_routes.go mounts it with a scope per route.
go tool oapi-codegen -config openapi/native.cfg.yaml openapi/native.yaml
