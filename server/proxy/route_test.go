package proxy

import (
	"net/http/httptest"
	"testing"
)

func TestParseSandboxHost(t *testing.T) {
	tests := []struct {
		host, domain string
		id           string
		port         int
		ok           bool
	}{
		{"49983-abc123.sbx.local", "sbx.local", "abc123", 49983, true},
		{"8080-abc123.sbx.local:3000", "sbx.local", "abc123", 8080, true},
		{"8080-ABC123.SBX.local", "sbx.local", "abc123", 8080, true},
		{"8080-abc123.sbx.local.", "sbx.local", "abc123", 8080, true},
		{"api.sbx.local", "sbx.local", "", 0, false},
		{"8080-abc.def.sbx.local", "sbx.local", "", 0, false},
		{"0-abc.sbx.local", "sbx.local", "", 0, false},
		{"65536-abc.sbx.local", "sbx.local", "", 0, false},
		{"+80-abc.sbx.local", "sbx.local", "", 0, false},
		{"80-ab_c.sbx.local", "sbx.local", "", 0, false},
		{"80-abc.other.local", "sbx.local", "", 0, false},
		{"80-abc-def.sbx.local", "sbx.local", "", 0, false},
		{"49983-abc123.localhost:3000", "localhost:3000", "abc123", 49983, true},
		{"49983-abc123.localhost", "localhost:3000", "abc123", 49983, true},
		{"49983-abc123.sbx.local:8443", "SBX.local.:8443", "abc123", 49983, true},
		{"localhost:3000", "localhost:3000", "", 0, false},
		{"49983-abc123.other:3000", "localhost:3000", "", 0, false},
	}
	for _, tt := range tests {
		id, port, ok := parseSandboxHost(tt.host, tt.domain)
		if id != tt.id || port != tt.port || ok != tt.ok {
			t.Errorf("parseSandboxHost(%q) = %q, %d, %v; want %q, %d, %v", tt.host, id, port, ok, tt.id, tt.port, tt.ok)
		}
	}
}

func TestDataPlaneTarget(t *testing.T) {
	tests := []struct {
		name           string
		host           string
		id, port       string
		wantID         string
		wantPort       int
		wantOK, wantEr bool
	}{
		{"api request", "127.0.0.1:3000", "", "", "", 0, false, false},
		{"headers", "127.0.0.1:3000", "abc", "49983", "abc", 49983, true, false},
		{"only id", "127.0.0.1:3000", "abc", "", "", 0, true, true},
		{"bad port", "127.0.0.1:3000", "abc", "x", "", 0, true, true},
		{"bad id", "127.0.0.1:3000", "a-b", "80", "", 0, true, true},
		{"host wins", "8080-xyz.sbx.local", "abc", "49983", "xyz", 8080, true, false},
	}
	for _, tt := range tests {
		r := httptest.NewRequest("GET", "http://"+tt.host+"/files", nil)
		if tt.id != "" {
			r.Header.Set(headerSandboxID, tt.id)
		}
		if tt.port != "" {
			r.Header.Set(headerSandboxPort, tt.port)
		}
		id, port, ok, err := dataPlaneTarget(r, "sbx.local")
		if id != tt.wantID || port != tt.wantPort || ok != tt.wantOK || (err != nil) != tt.wantEr {
			t.Errorf("%s: = %q, %d, %v, %v; want %q, %d, %v, err=%v", tt.name, id, port, ok, err, tt.wantID, tt.wantPort, tt.wantOK, tt.wantEr)
		}
	}
}

func FuzzParseSandboxHost(f *testing.F) {
	for _, s := range []string{"49983-abc.d", "x", "-.", "1-a.d:99", "99999-a.d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, host string) {
		id, port, ok := parseSandboxHost(host, "d")
		if ok && (!validSandboxID(id) || port < 1 || port > 65535) {
			t.Fatalf("parseSandboxHost(%q) accepted %q:%d", host, id, port)
		}
	})
}
