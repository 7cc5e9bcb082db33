// Package openapi holds sandboxd's OpenAPI specs and the oapi-codegen
// configurations; the generated servers live in its subpackages. This test
// is its only Go file: it fails when a spec changed without `make generate`.
package openapi

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

func TestGeneratedCodeIsCurrent(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command")
	}
	for _, tc := range []struct{ cfg, spec, generated string }{
		{"openapi/e2b.cfg.yaml", "openapi/e2b.yaml", "openapi/e2bapi/e2b.gen.go"},
		{"openapi/native.cfg.yaml", "openapi/native.yaml", "openapi/nativeapi/native.gen.go"},
	} {
		t.Run(filepath.Base(tc.spec), func(t *testing.T) {
			// The configuration names its output file, and oapi-codegen
			// prefers it to -o: generate from a copy that writes elsewhere.
			dir := t.TempDir()
			out := filepath.Join(dir, "gen.go")
			cfg, err := os.ReadFile(filepath.Join("..", tc.cfg))
			if err != nil {
				t.Fatal(err)
			}
			outLine := regexp.MustCompile(`(?m)^output: .*$`)
			if !outLine.Match(cfg) {
				t.Fatalf("%s has no output line", tc.cfg)
			}
			tmpCfg := filepath.Join(dir, "cfg.yaml")
			if err := os.WriteFile(tmpCfg, outLine.ReplaceAll(cfg, []byte("output: "+out)), 0o644); err != nil {
				t.Fatal(err)
			}
			// Read here too, so that go test's cache knows the spec.
			if _, err := os.ReadFile(filepath.Join("..", tc.spec)); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("go", "tool", "oapi-codegen", "-config", tmpCfg, tc.spec)
			cmd.Dir = ".." // the configurations' paths are relative to the repository root
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("oapi-codegen: %v\n%s", err, b)
			}
			want, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(filepath.Join("..", tc.generated))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("%s is not what oapi-codegen makes of %s: run `make generate`", tc.generated, tc.spec)
			}
		})
	}
}
