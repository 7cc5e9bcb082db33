package proxy

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/api/process/processconnect"
)

func envelope(flags byte, msg string) []byte {
	b := make([]byte, envelopeHeader, envelopeHeader+len(msg))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	return append(b, msg...)
}

// chunkReader returns its chunks one Read at a time, then err.
type chunkReader struct {
	chunks [][]byte
	err    error
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, r.err
	}
	n := copy(p, r.chunks[0])
	if n == len(r.chunks[0]) {
		r.chunks = r.chunks[1:]
	} else {
		r.chunks[0] = r.chunks[0][n:]
	}
	return n, nil
}

func (r *chunkReader) Close() error { return nil }

func TestStreamGuard(t *testing.T) {
	msg1, msg2 := envelope(0, `{"a":1}`), envelope(0, `{"b":2}`)
	end := envelope(flagEndStream, `{}`)
	cutErr := (&streamGuard{sandboxID: "sbx"}).endWithError()
	broken := errors.New("connection reset")
	canceled := envelope(flagEndStream, `{"error":{"code":"canceled","message":"context canceled"}}`)
	notFound := envelope(flagEndStream, `{"error":{"code":"not_found","message":"process 7"}}`)
	gone, leave := context.WithCancel(context.Background())
	leave()
	for _, tc := range []struct {
		name   string
		chunks [][]byte
		err    error
		want   []byte
		caller context.Context // nil: live
	}{
		{"whole stream", [][]byte{msg1, msg2, end}, io.EOF, cat(msg1, msg2, end), nil},
		{"split anywhere", [][]byte{msg1[:3], msg1[3:], msg2[:6], append(msg2[6:], end...)}, io.EOF, cat(msg1, msg2, end), nil},
		{"EOF at a boundary, no end", [][]byte{msg1}, io.EOF, cat(msg1, cutErr), nil},
		{"EOF in a header", [][]byte{msg1, msg2[:2]}, io.EOF, cat(msg1, cutErr), nil},
		{"reset in a message", [][]byte{msg1, msg2[:8]}, broken, cat(msg1, cutErr), nil},
		{"reset after the end", [][]byte{msg1, end}, broken, cat(msg1, end), nil},
		{"nothing at all", nil, broken, cutErr, nil},
		{"envd's canceled, the caller still there", [][]byte{msg1, canceled}, io.EOF, cat(msg1, cutErr), nil},
		{"envd's canceled, split", [][]byte{msg1, canceled[:7], canceled[7:]}, io.EOF, cat(msg1, cutErr), nil},
		{"envd's canceled after the caller left", [][]byte{msg1, canceled}, io.EOF, cat(msg1, canceled), gone},
		{"envd's other errors pass", [][]byte{msg1, notFound}, io.EOF, cat(msg1, notFound), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			chunks := make([][]byte, len(tc.chunks))
			for i, c := range tc.chunks {
				chunks[i] = bytes.Clone(c)
			}
			g := &streamGuard{body: &chunkReader{chunks: chunks, err: tc.err}, sandboxID: "sbx", caller: tc.caller}
			got, err := io.ReadAll(g)
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func cat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

// A sandbox that dies mid-stream: the client gets a Connect error
// (unavailable, the message E2B's SDKs probe the sandbox on), not a cut
// connection, over HTTP/1.1 and h2c.
func TestProxyStreamCutShort(t *testing.T) {
	env := newProxyEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	// An envd that sends the start event and then dies mid-envelope.
	go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		w.WriteHeader(http.StatusOK)
		start := envelope(0, `{"event":{"start":{"pid":42}}}`)
		w.Write(start)
		w.Write(envelope(0, `{"event":{"data":{"stdout":"aGk="}}}`)[:9])
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	env.d.set("dying", &fakeProxySandbox{ports: map[int]string{EnvdPort: ln.Addr().String()}})
	for _, h2c := range []bool{false, true} {
		ht := &proxyHeaderTransport{base: proxyClient(h2c).Transport, hdr: proxyEnvdHeaders("dying")}
		pc := processconnect.NewProcessClient(&http.Client{Transport: ht}, env.srv.URL, connect.WithProtoJSON())
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		stream, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "true"}}))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		var pid uint32
		for stream.Receive() {
			pid = stream.Msg().GetEvent().GetStart().GetPid()
		}
		err = stream.Err()
		stream.Close()
		cancel()
		if pid != 42 || connect.CodeOf(err) != connect.CodeUnavailable ||
			!strings.Contains(err.Error(), "ended before the stream completed") {
			t.Errorf("h2c=%v: pid %d, err %v; want the start event, then unavailable", h2c, pid, err)
		}
	}
}
