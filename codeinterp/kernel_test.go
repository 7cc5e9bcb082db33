package codeinterp

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Messages signed with the kernel's key decode with their channel and
// parent; tampered, unsigned or truncated ones do not.
func TestSignedMessages(t *testing.T) {
	key := signer("k3y")
	parent, _ := json.Marshal(header{MsgID: "req-1", MsgType: "execute_request"})
	frames, err := key.encode(header{MsgID: "m", MsgType: "stream"}, parent, []byte(`{"name":"stdout","text":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	// iopub's topic frame comes before the delimiter.
	withTopic := append([][]byte{[]byte("kernel.x.stream")}, frames...)
	m, err := key.decode(withTopic, "iopub")
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.MsgType != "stream" || m.ParentHeader.MsgID != "req-1" || m.Channel != "iopub" || string(m.Content) != `{"name":"stdout","text":"hi"}` {
		t.Errorf("decoded %+v", m)
	}
	if _, err := signer("").decode(frames, "shell"); err != nil {
		t.Errorf("without a key, signatures are not checked: %v", err)
	}

	tampered := append([][]byte{}, frames...)
	tampered[5] = []byte(`{"name":"stdout","text":"bye"}`)
	unsigned := append([][]byte{}, frames...)
	unsigned[1] = nil
	for name, f := range map[string][][]byte{"tampered": tampered, "unsigned": unsigned, "other key": mustEncode(t, signer("other"))} {
		if _, err := key.decode(f, "shell"); !errors.Is(err, errSignature) {
			t.Errorf("%s: %v, want a signature error", name, err)
		}
	}
	if _, err := key.decode(frames[:5], "shell"); err == nil || !strings.Contains(err.Error(), "parts after its delimiter") {
		t.Errorf("truncated: %v", err)
	}
}

func mustEncode(t *testing.T, s signer) [][]byte {
	f, err := s.encode(header{MsgID: "m"}, []byte("{}"), []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Connection files that the client cannot use say why.
func TestConnInfo(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{`{"transport":"tcp","ip":"127.0.0.1","shell_port":1,"iopub_port":2,"key":"k","signature_scheme":"hmac-sha256"}`, ""},
		{`{"transport":"ipc","ip":"kernel","shell_port":1,"iopub_port":2}`, `transport "ipc"`},
		{`{"transport":"tcp","ip":"127.0.0.1","shell_port":1,"iopub_port":2,"key":"k","signature_scheme":"hmac-md5"}`, `signature scheme "hmac-md5"`},
		{`{"transport":"tcp","ip":"127.0.0.1","shell_port":1}`, "no shell or iopub port"},
		{`{`, "unexpected end of JSON"},
	} {
		p := filepath.Join(t.TempDir(), "kernel-x.json")
		if err := os.WriteFile(p, []byte(tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := readConnInfo(p)
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.file, err, tc.want)
		}
	}
}
