package main

import (
	"net/http"
	"syscall"
	"testing"

	"github.com/sandboxd/sandboxd/store"
)

// TestReconcileReinitsUnsettled: a sandbox that runs while a crash left its
// row "resuming" (sandboxd died between the backend's resume and envd's
// /init) gets /init again from the next sandboxd's Reconcile. Its envd
// here already has its token: the real envd must accept the same token,
// env vars and user again, so that the sandbox is adopted as running, not
// destroyed, and its token still guards it.
func TestReconcileReinitsUnsettled(t *testing.T) {
	e := newE2EEnv(t, "alice")
	s1 := e.start()
	key := e.keys["alice"]
	id, tok := e.createKept(t, key)
	want := s1.mustRun(t, id, tok, `echo "$SBX_KEPT $(id -un)"`).stdout
	if err := s1.stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	st, err := store.Open(t.Context(), e.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	row, err := st.GetSandboxAny(t.Context(), id)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	row.State = store.StateResuming
	err = st.UpdateSandbox(t.Context(), &row)
	st.Close()
	if err != nil {
		t.Fatal(err)
	}

	s2 := e.start()
	if got := s2.get(t, key, id).State; got != "running" {
		t.Fatalf("after Reconcile: %s; want running", got)
	}
	if l := e2eAuditLine(s2, "reconcile_running", id); l == nil || l["result"] != "ok" {
		t.Errorf("audit line reconcile_running: %v; want result ok", l)
	}
	if got := s2.mustRun(t, id, tok, `echo "$SBX_KEPT $(id -un)"`).stdout; got != want {
		t.Errorf("env var and user after the re-init: %q; want %q", got, want)
	}
	wantStatus(t, "GET /files without the token", s2.envd(t, id, "", http.MethodGet, "/files?path=/etc/hostname", nil, ""), http.StatusUnauthorized)
	wantStatus(t, "kill", s2.api(t, http.MethodDelete, "/sandboxes/"+id, key, nil), http.StatusNoContent)
}
