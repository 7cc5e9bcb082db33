package envdconn_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxd/sandboxd/runtime"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
)

// serve answers /health with status on a unix socket at dir/name, or
// dir/envd.sock.
func serve(t *testing.T, dir string, status int, name ...string) string {
	t.Helper()
	path := filepath.Join(dir, "envd.sock")
	if len(name) > 0 {
		path = filepath.Join(dir, name[0])
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(status)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return path
}

func TestDialSocket(t *testing.T) {
	dir := t.TempDir()
	sock := serve(t, dir, http.StatusNoContent)
	ctx := t.Context()

	c, err := envdconn.DialSocket(ctx, sock, "sb")
	if err != nil {
		t.Fatalf("DialSocket(socket): %v", err)
	}
	c.Close()

	link := filepath.Join(t.TempDir(), "envd.sock")
	if err := os.Symlink(sock, link); err != nil {
		t.Fatal(err)
	}
	if c, err := envdconn.DialSocket(ctx, link, "sb"); err == nil {
		c.Close()
		t.Errorf("DialSocket through a symlink succeeded")
	}

	file := filepath.Join(t.TempDir(), "envd.sock")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := envdconn.DialSocket(ctx, file, "sb"); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("DialSocket(regular file) = %v; want not a socket", err)
	}
}

func TestCheckPort(t *testing.T) {
	for _, p := range []int{0, -1, 65536} {
		if err := envdconn.CheckPort("sb", p); !errors.Is(err, runtime.ErrInvalidSpec) {
			t.Errorf("CheckPort(%d) = %v; want ErrInvalidSpec", p, err)
		}
	}
	if err := envdconn.CheckPort("sb", runtime.EnvdPort); err != nil {
		t.Errorf("CheckPort(EnvdPort) = %v", err)
	}
}

func TestWaitHealthy(t *testing.T) {
	sock := serve(t, t.TempDir(), http.StatusNoContent)
	dial := func(ctx context.Context) (net.Conn, error) { return envdconn.DialSocket(ctx, sock, "sb") }
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := envdconn.WaitHealthy(ctx, dial, envdconn.Health{}); err != nil {
		t.Fatalf("WaitHealthy: %v", err)
	}

	// No envd: the wait ends with ctx, or at once when init has exited.
	missing := filepath.Join(t.TempDir(), "envd.sock")
	dial = func(ctx context.Context) (net.Conn, error) { return envdconn.DialSocket(ctx, missing, "sb") }
	short, cancel2 := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel2()
	if err := envdconn.WaitHealthy(short, dial, envdconn.Health{}); !errors.Is(err, runtime.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitHealthy(no envd) = %v; want ErrUnavailable and DeadlineExceeded", err)
	}
	exited := make(chan struct{})
	close(exited)
	err := envdconn.WaitHealthy(t.Context(), dial, envdconn.Health{Exited: exited, LogHint: "its log is x.log"})
	if !errors.Is(err, runtime.ErrUnavailable) || !strings.Contains(err.Error(), "envd exited before answering (its log is x.log)") {
		t.Errorf("WaitHealthy(exited) = %v; want ErrUnavailable naming the log", err)
	}
}

// TestWaitHealthySocket: with Socket set, the wait wakes up when the socket
// appears (renamed into place, as envd does) or, when it exists but does not
// accept yet, polls it. SlowPoll is an hour, so only those paths can end the
// wait before ctx does.
func TestWaitHealthySocket(t *testing.T) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	tests := []struct {
		name string
		// before runs before the wait begins; what it returns makes sock
		// answer once the wait has polled, and returns its stop.
		before func(t *testing.T, sock string) func(t *testing.T, sock string) func()
	}{
		{
			name: "renamed into place",
			before: func(t *testing.T, _ string) func(*testing.T, string) func() {
				return func(t *testing.T, sock string) func() {
					tmp := sock + ".tmp"
					ln, err := net.Listen("unix", tmp)
					if err != nil {
						t.Fatal(err)
					}
					if err := os.Rename(tmp, sock); err != nil {
						t.Fatal(err)
					}
					srv := &http.Server{Handler: handler}
					go srv.Serve(ln)
					return func() { srv.Close() }
				}
			},
		},
		{
			name: "bound before listening",
			before: func(t *testing.T, sock string) func(*testing.T, string) func() {
				fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
				if err != nil {
					t.Fatal(err)
				}
				if err := unix.Bind(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
					unix.Close(fd)
					t.Fatal(err)
				}
				return func(t *testing.T, _ string) func() {
					if err := unix.Listen(fd, 16); err != nil {
						t.Fatal(err)
					}
					f := os.NewFile(uintptr(fd), "sock")
					ln, err := net.FileListener(f)
					f.Close()
					if err != nil {
						t.Fatal(err)
					}
					srv := &http.Server{Handler: handler}
					go srv.Serve(ln)
					return func() { srv.Close() }
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sock := filepath.Join(t.TempDir(), "envd.sock")
			start := tt.before(t, sock)
			dial := func(ctx context.Context) (net.Conn, error) { return envdconn.DialSocket(ctx, sock, "sb") }
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			// The first /health fails (nothing answers yet); the
			// server starts once the wait has polled at least once.
			polled := make(chan struct{})
			var once sync.Once
			counted := func(ctx context.Context) (net.Conn, error) {
				c, err := dial(ctx)
				once.Do(func() { close(polled) })
				return c, err
			}
			done := make(chan error, 1)
			go func() {
				done <- envdconn.WaitHealthy(ctx, counted, envdconn.Health{Socket: sock, SlowPoll: time.Hour})
			}()
			<-polled
			stop := start(t, sock)
			t.Cleanup(stop)
			if err := <-done; err != nil {
				t.Fatalf("WaitHealthy: %v", err)
			}
		})
	}
}

// TestWaitHealthySharedDir: waits on two sockets of one directory share its
// watch; the first to end must not take the watch from the other.
func TestWaitHealthySharedDir(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	wait := func(name string) (<-chan error, <-chan struct{}) {
		sock := filepath.Join(dir, name)
		polled := make(chan struct{})
		var once sync.Once
		dial := func(ctx context.Context) (net.Conn, error) {
			c, err := envdconn.DialSocket(ctx, sock, "sb")
			once.Do(func() { close(polled) })
			return c, err
		}
		done := make(chan error, 1)
		go func() { done <- envdconn.WaitHealthy(ctx, dial, envdconn.Health{Socket: sock, SlowPoll: time.Hour}) }()
		return done, polled
	}
	doneA, polledA := wait("a.sock")
	doneB, polledB := wait("b.sock")
	<-polledA
	<-polledB
	for _, step := range []struct {
		name string
		done <-chan error
	}{{"a.sock", doneA}, {"b.sock", doneB}} {
		serve(t, dir, http.StatusNoContent, step.name)
		if err := <-step.done; err != nil {
			t.Fatalf("WaitHealthy(%s): %v", step.name, err)
		}
	}
}

// TestWaitHealthyInit: with Init, the probe posts the body to /init and the
// wait ends once envd accepts it; an envd that refuses it ends the wait at
// once with its answer, not at the deadline.
func TestWaitHealthyInit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		status  int
		wantErr string
	}{
		{"accepted", http.StatusNoContent, ""},
		{"refused", http.StatusUnauthorized, "envd /init: 401 Unauthorized: no"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "envd.sock")
			ln, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan string, 10)
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				got <- r.Method + " " + r.URL.Path + " " + r.Header.Get("Content-Type") + " " + string(b)
				w.WriteHeader(tc.status)
				if tc.status != http.StatusNoContent {
					_, _ = w.Write([]byte("no\n"))
				}
			})}
			go srv.Serve(ln)
			t.Cleanup(func() { srv.Close() })
			dial := func(ctx context.Context) (net.Conn, error) { return envdconn.DialSocket(ctx, path, "sb") }
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			err = envdconn.WaitHealthy(ctx, dial, envdconn.Health{Init: []byte(`{"envVars":{"A":"1"}}`)})
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("WaitHealthy: %v", err)
			case tc.wantErr != "" && (err == nil || err.Error() != tc.wantErr):
				t.Fatalf("WaitHealthy = %v; want %q", err, tc.wantErr)
			}
			if req, want := <-got, `POST /init application/json {"envVars":{"A":"1"}}`; req != want {
				t.Errorf("envd got %q; want %q", req, want)
			}
			if len(got) != 0 {
				t.Errorf("envd got %d more requests", len(got))
			}
		})
	}
}
