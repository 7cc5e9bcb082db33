package incus

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"testing"

	"github.com/sandboxd/sandboxd/runtime"
)

// TestRemoveLayerStaleListing: RemoveLayer lists the instances before it
// looks at the sandboxes in memory, so a destroyed sandbox's deletion can
// finish in between; its instance, listed but gone, does not hold the
// layer. One still there and not being deleted does.
func TestRemoveLayerStaleListing(t *testing.T) {
	const key, id = "k1", "rt-0123456789ab"
	for _, tc := range []struct {
		name      string
		userThere bool // the listed user still exists when asked again
		wantErr   error
	}{
		{name: "deleted since the listing", wantErr: nil},
		{name: "a live user not adopted yet", userThere: true, wantErr: runtime.ErrInUse},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &Backend{log: slog.New(slog.DiscardHandler), owner: "test",
				sbx: map[string]*sandbox{}, deleting: map[string]chan struct{}{}}
			b.opts.Namespace = "ns"
			layer, user := b.layerName(key), b.instanceName(id)
			sync200 := func(w http.ResponseWriter, v any) {
				_ = json.NewEncoder(w).Encode(map[string]any{"type": "sync", "status_code": 200, "metadata": v})
			}
			f, client := newRecordingIncus(t, func(w http.ResponseWriter, r *http.Request) {
				switch {
				case r.Method == http.MethodGet && r.URL.Path == "/1.0/instances/"+layer:
					sync200(w, Instance{Name: layer, Config: map[string]string{keyLayer: key, keyNamespace: "ns"}})
				case r.Method == http.MethodGet && r.URL.Path == "/1.0/instances":
					sync200(w, []Instance{{Name: user, Config: map[string]string{keyID: id, keyNamespace: "ns", keySource: layer}}})
				case r.Method == http.MethodGet && r.URL.Path == "/1.0/instances/"+user && tc.userThere:
					sync200(w, Instance{Name: user, Status: "Running", Config: map[string]string{keyID: id, keyNamespace: "ns", keySource: layer}})
				case r.Method == http.MethodDelete && r.URL.Path == "/1.0/instances/"+layer:
					w.WriteHeader(http.StatusAccepted)
					_ = json.NewEncoder(w).Encode(map[string]any{"type": "async", "status_code": 100, "operation": "/1.0/operations/op-del", "metadata": map[string]any{}})
				case r.URL.Path == "/1.0/operations/op-del/wait":
					sync200(w, map[string]any{"id": "op-del", "status_code": 200})
				default:
					w.WriteHeader(http.StatusNotFound)
					_ = json.NewEncoder(w).Encode(map[string]any{"type": "error", "error": "Instance not found", "error_code": 404})
				}
			})
			b.c = client

			err := b.RemoveLayer(context.Background(), key)
			deleted, calls := f.called("DELETE /1.0/instances/" + layer)
			switch {
			case tc.wantErr == nil && (err != nil || !deleted):
				t.Fatalf("RemoveLayer = %v, layer deleted %v; want nil and deleted (calls %v)", err, deleted, calls)
			case tc.wantErr != nil && (!errors.Is(err, tc.wantErr) || deleted):
				t.Fatalf("RemoveLayer = %v, layer deleted %v; want %v and kept (calls %v)", err, deleted, tc.wantErr, calls)
			}
		})
	}
}
