package sandbox

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sandboxd/sandboxd/errdefs"
	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/store"
)

// TestPauseKinds: memory=false pauses to disk where the backend can, and a
// resume that restarted the sandbox hands its envd the same /init as the
// create did; a backend that cannot pause to disk pauses in memory.
func TestPauseKinds(t *testing.T) {
	for _, tc := range []struct {
		name        string
		memory      bool
		noDiskPause bool
		wantDisk    bool
		wantInits   int
	}{
		{"memory", true, false, false, 1},
		{"disk", false, false, true, 2},
		{"disk unsupported: memory instead", false, true, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t, nil)
			e.be.NoDiskPause.Store(tc.noDiskPause)
			sb, err := e.m.Create(as("a"), CreateRequest{Secure: true, EnvVars: map[string]string{"K": "v"}})
			if err != nil {
				t.Fatal(err)
			}
			if err := e.m.Pause(as("a"), sb.ID, tc.memory); err != nil {
				t.Fatalf("Pause(memory=%v) = %v", tc.memory, err)
			}
			if got := e.be.PausedToDisk(sb.ID); got != tc.wantDisk {
				t.Errorf("paused to disk = %v; want %v", got, tc.wantDisk)
			}
			if _, resumed, err := e.m.Connect(as("a"), sb.ID, 0); err != nil || !resumed {
				t.Fatalf("Connect = %v, %v; want resumed", resumed, err)
			}
			inits := e.be.Inits(sb.ID)
			if len(inits) != tc.wantInits {
				t.Fatalf("/init calls = %d (%v); want %d", len(inits), inits, tc.wantInits)
			}
			last := inits[len(inits)-1]
			env, _ := last["envVars"].(map[string]any)
			if env["K"] != "v" || last["accessToken"] != sb.EnvdAccessToken || last["defaultUser"] != "user" {
				t.Errorf("last /init = %v; want the create's env vars, token and default user", last)
			}
		})
	}
}

// TestResumeInitFails: a restarted sandbox whose envd refuses /init is put
// back to disk and stays paused, so that a retry starts over.
func TestResumeInitFails(t *testing.T) {
	e := newTestEnv(t, nil)
	sb, err := e.m.Create(as("a"), CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Pause(as("a"), sb.ID, false); err != nil {
		t.Fatal(err)
	}
	e.be.FailInit.Store(true)
	if _, _, err := e.m.Connect(as("a"), sb.ID, 0); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Connect with a failing /init = %v; want ErrUnavailable", err)
	}
	got, err := e.m.Get(as("a"), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != store.StatePaused || !e.be.PausedToDisk(sb.ID) {
		t.Errorf("after a failed resume: state %s, paused to disk %v; want paused to disk", got.State, e.be.PausedToDisk(sb.ID))
	}
	e.be.FailInit.Store(false)
	if _, resumed, err := e.m.Connect(as("a"), sb.ID, 0); err != nil || !resumed {
		t.Fatalf("retried Connect = %v, %v; want resumed", resumed, err)
	}
}

// TestTemplateResources: a create that names no resources gets its
// template's, where the backend declares them, else the configured
// defaults; the pool key follows the same rule.
func TestTemplateResources(t *testing.T) {
	// A cap above every count here, so the test does not depend on the
	// host's CPUs (TestDefaultsClampedToCaps covers the cap).
	e := newTestEnv(t, func(c *Config) { c.MaxCPU = 8 })
	e.be.Resources = map[string]runtime.Resources{"big": {CPUCount: 4, MemoryMB: 2048}}
	for _, tc := range []struct {
		name          string
		req           CreateRequest
		cpu, mem, dsk int
	}{
		{"template's, default disk", CreateRequest{Template: "big"}, 4, 2048, 1024},
		{"request's own win", CreateRequest{Template: "big", MemoryMB: 256}, 4, 256, 1024},
		{"no declared resources", CreateRequest{}, 2, 512, 1024},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb, err := e.m.Create(as("a"), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if sb.CPUCount != tc.cpu || sb.MemoryMB != tc.mem || sb.DiskMB != tc.dsk {
				t.Errorf("created with cpu %d memory %d disk %d; want %d %d %d", sb.CPUCount, sb.MemoryMB, sb.DiskMB, tc.cpu, tc.mem, tc.dsk)
			}
			k := e.m.PoolKey("a", tc.req)
			if k.CPUCount != tc.cpu || k.MemoryMB != tc.mem || k.DiskMB != tc.dsk {
				t.Errorf("pool key %+v; want cpu %d memory %d disk %d", k, tc.cpu, tc.mem, tc.dsk)
			}
		})
	}
}

// TestPauseRestarted: a pause to disk that the backend had to undo by
// starting the sandbox afresh fails, and the new envd gets its /init.
func TestPauseRestarted(t *testing.T) {
	e := newTestEnv(t, nil)
	e.be.RestartOnDiskPause.Store(true)
	sb, err := e.m.Create(as("a"), CreateRequest{EnvVars: map[string]string{"K": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.m.Pause(as("a"), sb.ID, false); err == nil {
		t.Fatal("Pause = nil; want the backend's error")
	}
	got, err := e.m.Get(as("a"), sb.ID)
	if err != nil || got.State != store.StateRunning {
		t.Fatalf("after the failed pause: %v, %v; want running", got, err)
	}
	if inits := e.be.Inits(sb.ID); len(inits) != 2 {
		t.Errorf("/init calls = %d; want 2 (create, restart)", len(inits))
	}
}

// TestTimeoutPauseKinds: at its timeout, a sandbox with onTimeout pause
// pauses in memory, and one with autoPauseMemory false (pause_disk) to disk.
func TestTimeoutPauseKinds(t *testing.T) {
	for _, tc := range []struct {
		on       store.OnTimeout
		wantDisk bool
	}{
		{store.OnTimeoutPause, false},
		{store.OnTimeoutPauseDisk, true},
	} {
		t.Run(string(tc.on), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newTestEnv(t, nil)
				sb, err := e.m.Create(as("a"), CreateRequest{Timeout: time.Minute, Lifecycle: store.Lifecycle{OnTimeout: tc.on}})
				if err != nil {
					t.Fatal(err)
				}
				time.Sleep(61 * time.Second)
				e.m.Sweep(context.Background())
				if st := e.state(t, sb.ID).State; st != store.StatePaused {
					t.Fatalf("after the timeout: %s; want paused", st)
				}
				if got := e.be.PausedToDisk(sb.ID); got != tc.wantDisk {
					t.Errorf("paused to disk = %v; want %v", got, tc.wantDisk)
				}
			})
		})
	}
}
