package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/sandbox"
)

// A create no host could honour is a 400 naming the limit on both routes
// (not a 503 that clients retry forever), and the CPU count answered and
// read back is the one in force.
func TestCreateBoundsAnswer400(t *testing.T) {
	host := func() (int, error) { return 24 * 1024, nil } // a 24 GiB host
	e := newLimitEnvWith(t, func(c *sandbox.Config) {
		c.HostReserveMB, c.MemAvailable, c.MemTotal = 512, host, host
		c.DiskInMemory = true
		c.DefaultCPU, c.MaxCPU = 4, 2
	})
	e.be.Resources = map[string]runtime.Resources{"huge": {MemoryMB: 100000}}
	tests := []struct {
		name, path, body, want string
	}{
		{"native memory", NativePrefix, `{"template":"base","memory_mb":100000}`, "host's memory"},
		{"native disk", NativePrefix, `{"template":"base","disk_mb":200000}`, "disk size 200000 MiB exceeds the limit"},
		{"native cpu", NativePrefix, `{"template":"base","cpu_count":511}`, "CPU count 511 exceeds the limit of 2"},
		{"e2b template too large", E2BPrefix + "/sandboxes", `{"templateID":"huge","timeout":60}`, "host's memory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.clock.advance(10e9) // a fresh create token
			rec := e.do(t, "b", http.MethodPost, tt.path, tt.body)
			if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), tt.want) {
				t.Fatalf("create = %d %s; want 400 naming %q", rec.Code, rec.Body, tt.want)
			}
		})
	}
	var errBody struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	e.clock.advance(10e9)
	rec := e.do(t, "b", http.MethodPost, E2BPrefix+"/sandboxes", `{"templateID":"huge","timeout":60}`)
	if err := json.Unmarshal(rec.Body.Bytes(), &errBody); err != nil || errBody.Code != 400 || errBody.Message == "" {
		t.Fatalf("e2b 400 body = %s; want E2B's error shape with code 400", rec.Body)
	}

	// The default (4) is above the cap (2): what is in force is answered,
	// read back and given to the backend, on both routes.
	e.clock.advance(10e9)
	rec = e.do(t, "b", http.MethodPost, NativePrefix, `{"template":"base"}`)
	var native struct {
		ID       string `json:"id"`
		CPUCount int    `json:"cpu_count"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &native); err != nil || rec.Code != http.StatusCreated || native.CPUCount != 2 {
		t.Fatalf("native create = %d %s; want 201 with cpu_count 2", rec.Code, rec.Body)
	}
	e.clock.advance(10e9)
	rec = e.create(t, "b")
	var created struct {
		SandboxID string `json:"sandboxID"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &created); err != nil || rec.Code != http.StatusCreated {
		t.Fatalf("e2b create = %d %s; want 201", rec.Code, rec.Body)
	}
	rec = e.do(t, "b", http.MethodGet, E2BPrefix+"/sandboxes/"+created.SandboxID, "")
	var info struct {
		CPUCount int `json:"cpuCount"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &info); err != nil || info.CPUCount != 2 {
		t.Fatalf("getInfo = %d %s; want cpuCount 2", rec.Code, rec.Body)
	}
	for _, id := range []string{native.ID, created.SandboxID} {
		if spec := e.be.Get(id).Spec; spec.CPUCount != 2 {
			t.Fatalf("backend spec of %s has %d CPUs; want 2", id, spec.CPUCount)
		}
	}
}
