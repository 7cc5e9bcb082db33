package server

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sandboxd/sandboxd/openapi/nativeapi"
)

// TestNativeSpec: openapi/native.yaml is valid OpenAPI 3.0, and the copy
// embedded in the generated code is current (else: run `make generate`).
func TestNativeSpec(t *testing.T) {
	data, err := os.ReadFile("../openapi/native.yaml")
	if err != nil {
		t.Fatal(err)
	}
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(data)
	if err != nil {
		t.Fatalf("load openapi/native.yaml: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("openapi/native.yaml is not valid OpenAPI 3.0: %v", err)
	}
	embedded, err := nativeapi.GetSwagger()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(doc)
	got, _ := json.Marshal(embedded)
	if string(got) != string(want) {
		t.Fatal("the spec embedded in native.gen.go differs from openapi/native.yaml: run `make generate`")
	}
}
