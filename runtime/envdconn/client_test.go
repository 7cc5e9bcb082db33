package envdconn_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd"
	envdapi "github.com/sandboxd/sandboxd/envd/api"
	"github.com/sandboxd/sandboxd/envd/api/filesystem"
	"github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
)

// realEnvd serves a real envd, initialised with token, whose default user
// is the one the test runs as, and returns a dial to it and a user for the
// Client: nobody when the test can switch to it (root), so that the user
// the Client sends is seen to count.
func realEnvd(t *testing.T, token string) (envdconn.DialFunc, string) {
	t.Helper()
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	srv := envd.New(envd.Config{Log: slog.New(slog.DiscardHandler), DefaultUser: me.Username, DiskPath: t.TempDir()})
	t.Cleanup(srv.Close)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", ts.Listener.Addr().String())
	}
	body, err := json.Marshal(envdapi.InitRequest{AccessToken: &token})
	if err != nil {
		t.Fatal(err)
	}
	status, msg, err := envdconn.Ask(t.Context(), dial, http.MethodPost, "/init", body)
	if err == nil {
		err = envdconn.Answered("/init", status, msg)
	}
	if err != nil {
		t.Fatal(err)
	}
	if me.Uid == "0" {
		return dial, "nobody"
	}
	return dial, me.Username
}

// TestClient drives a real envd through every part of the Client: the
// process service, /files both ways and the filesystem service, with the
// access token and the user it sends.
func TestClient(t *testing.T) {
	dial, me := realEnvd(t, "secret")
	c := envdconn.NewClient(dial, "secret", me)
	t.Cleanup(c.Close)
	ctx := t.Context()

	cwd := "/" // nobody's home does not exist
	req := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "id -un"}, Cwd: &cwd}})
	c.Auth(req.Header())
	stream, err := c.Process().Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for stream.Receive() {
		out.Write(stream.Msg().GetEvent().GetData().GetStdout())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	if got := strings.TrimSpace(out.String()); got != me {
		t.Errorf("the process ran as %q; want %q", got, me)
	}

	// envd reads and writes files with the user's rights, so the directory
	// must be reachable by nobody: t.TempDir's parent is root's alone.
	dir, err := os.MkdirTemp("", "envdconn-client-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "f.txt")
	resp, err := c.Files(ctx, http.MethodPost, path, strings.NewReader("hello"), 5)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload: %s", resp.Status)
	}
	resp, err = c.Files(ctx, http.MethodGet, path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || string(got) != "hello" {
		t.Errorf("download: %s %q %v; want 200 \"hello\"", resp.Status, got, err)
	}

	sreq := connect.NewRequest(&filesystem.StatRequest{Path: path})
	c.Auth(sreq.Header())
	st, err := c.Filesystem().Stat(ctx, sreq)
	if err != nil {
		t.Fatal(err)
	}
	if st.Msg.GetEntry().GetSize() != 5 {
		t.Errorf("Stat size = %d; want 5", st.Msg.GetEntry().GetSize())
	}
}

// TestClientWrongToken: every part of the Client sends its token, so a
// wrong one is refused everywhere.
func TestClientWrongToken(t *testing.T) {
	dial, me := realEnvd(t, "secret")
	c := envdconn.NewClient(dial, "wrong", me)
	t.Cleanup(c.Close)
	ctx := t.Context()

	req := connect.NewRequest(&filesystem.StatRequest{Path: "/"})
	c.Auth(req.Header())
	if _, err := c.Filesystem().Stat(ctx, req); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("Stat with a wrong token: %v; want unauthenticated", err)
	}
	resp, err := c.Files(ctx, http.MethodGet, "/etc/hostname", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("download with a wrong token: %s; want 401", resp.Status)
	}
}

// TestLogs reads a real envd's records after a cursor, with the token,
// and a wrong token is refused.
func TestLogs(t *testing.T) {
	dial, _ := realEnvd(t, "secret")
	ctx := t.Context()
	all, err := envdconn.Logs(ctx, dial, "secret", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if all.Boot == "" || len(all.Records) == 0 || all.Records[len(all.Records)-1].Seq != all.Last {
		t.Fatalf("first read: %+v; want a boot and records up to Last", all)
	}
	if _, ok := findMsg(all.Records, "initialised"); !ok {
		t.Errorf("no initialised record in %+v", all.Records)
	}
	next, err := envdconn.Logs(ctx, dial, "secret", all.Boot, all.Last)
	if err != nil || len(next.Records) != 0 || next.Last != all.Last {
		t.Errorf("after the last: %+v, %v; want no records", next, err)
	}
	// Another run's cursor reads everything.
	if again, err := envdconn.Logs(ctx, dial, "secret", "another-boot", all.Last); err != nil || len(again.Records) != len(all.Records) {
		t.Errorf("another boot's cursor: %d records, %v; want all %d", len(again.Records), err, len(all.Records))
	}
	if _, err := envdconn.Logs(ctx, dial, "wrong", "", 0); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("wrong token: %v; want a 401", err)
	}
}

func findMsg(recs []envdapi.LogRecord, msg string) (envdapi.LogRecord, bool) {
	for _, r := range recs {
		if r.Msg == msg {
			return r, true
		}
	}
	return envdapi.LogRecord{}, false
}
