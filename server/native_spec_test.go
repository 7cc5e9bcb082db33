package server

import (
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// loadNativeSpec loads openapi/native.yaml and checks it is valid OpenAPI 3.0.
// (The generated code embeds no copy: openapi/generate_test.go checks that
// it is current.)
func loadNativeSpec(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile("../openapi/native.yaml")
	if err != nil {
		t.Fatalf("load openapi/native.yaml: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("openapi/native.yaml is not valid OpenAPI 3.0: %v", err)
	}
	return doc
}

func TestNativeSpec(t *testing.T) { loadNativeSpec(t) }
