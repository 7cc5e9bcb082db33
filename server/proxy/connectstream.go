package proxy

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"connectrpc.com/connect"
)

// A Connect server stream (Content-Type application/connect+json or +proto)
// is a sequence of envelopes: a flags byte, a 4-byte big-endian length and
// the message; the last one has flag endStream and carries the outcome.
// When the sandbox dies mid-stream the upstream body breaks off, and
// ReverseProxy then aborts the client's response: over HTTP/1.1 mid-chunk,
// which the Python SDK does not read as a dropped connection, so it never
// asks whether the sandbox is gone. streamGuard ends such a stream well
// formed instead, with the end-of-stream error E2B's own proxy sends
// (unavailable, "...ended before the stream completed"): both SDKs then
// probe the sandbox and report it gone, over HTTP/1.1 and HTTP/2 alike.
//
// envd can also see the cut first and end the stream itself with canceled
// (its request's context ends when its side of the connection does), and
// that answer can still get through: seen once on an Incus cluster, where
// a member's relay sits between. The SDKs read canceled as the caller's
// own doing and raise a timeout without asking about the sandbox; so
// while the caller has not cancelled, the guard ends such a stream as a
// cut one too.
const (
	envelopeHeader = 5
	flagEndStream  = 0x02
	// maxGuarded is the largest message the guard holds back until it is
	// whole; a stream with a larger one is passed through unguarded.
	maxGuarded = 4 << 20
)

func isConnectStream(h http.Header) bool {
	return strings.HasPrefix(h.Get("Content-Type"), "application/connect+")
}

// guardConnectStream wraps the body of a Connect server stream in a
// streamGuard.
func guardConnectStream(resp *http.Response) {
	if resp.StatusCode == http.StatusOK && isConnectStream(resp.Header) {
		t, _ := resp.Request.Context().Value(proxyTargetKey{}).(proxyTarget)
		resp.Body = &streamGuard{body: resp.Body, sandboxID: t.id, caller: resp.Request.Context()}
	}
}

// streamGuard passes whole envelopes through and turns a body that breaks
// off (an error, or EOF before the end-of-stream envelope) into an
// end-of-stream envelope with an unavailable error.
type streamGuard struct {
	body      io.ReadCloser
	sandboxID string
	caller    context.Context // the client's request; nil: never cancelled
	in        []byte          // read, not yet a whole envelope
	out       []byte          // whole envelopes (or the closing error), not yet returned
	ended     bool            // the upstream's end-of-stream envelope went out
	passThru  bool            // a message over maxGuarded: no more guarding
	done      bool            // nothing more after out
	scratch   [32 << 10]byte
}

func (g *streamGuard) Read(p []byte) (int, error) {
	for len(g.out) == 0 {
		if g.done {
			return 0, io.EOF
		}
		if g.passThru {
			return g.body.Read(p)
		}
		n, err := g.body.Read(g.scratch[:])
		g.in = append(g.in, g.scratch[:n]...)
		g.cut()
		if err != nil {
			// EOF or a broken connection: after the upstream's own end of
			// stream that is the end; before it, the stream was cut (what
			// is held of a partial envelope is dropped).
			g.done = true
			if !g.ended {
				g.out = append(g.out, g.endWithError()...)
			}
		}
	}
	n := copy(p, g.out)
	g.out = g.out[n:]
	return n, nil
}

// cut moves the whole envelopes at the front of in to out.
func (g *streamGuard) cut() {
	for len(g.in) >= envelopeHeader {
		size := int(binary.BigEndian.Uint32(g.in[1:envelopeHeader]))
		if size > maxGuarded {
			// Hand over what is held and stop guarding.
			g.out = append(g.out, g.in...)
			g.in = nil
			g.passThru = true
			return
		}
		if len(g.in) < envelopeHeader+size {
			return
		}
		env := g.in[:envelopeHeader+size]
		if g.in[0]&flagEndStream != 0 {
			g.ended = true
			if g.cutByUpstream(env[envelopeHeader:]) {
				env = g.endWithError()
			}
		}
		g.out = append(g.out, env...)
		g.in = g.in[envelopeHeader+size:]
	}
}

// cutByUpstream reports whether end, an end-of-stream message, is envd's
// canceled while the caller has not cancelled: the connection was cut on
// the sandbox's side. (The end-of-stream message is JSON in both codecs.)
func (g *streamGuard) cutByUpstream(end []byte) bool {
	if g.caller != nil && g.caller.Err() != nil {
		return false
	}
	var m struct {
		Error *struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	return json.Unmarshal(end, &m) == nil && m.Error != nil && m.Error.Code == connect.CodeCanceled.String()
}

// endWithError is the end-of-stream envelope of a stream cut short.
func (g *streamGuard) endWithError() []byte {
	msg, _ := json.Marshal(map[string]any{"error": map[string]string{
		"code":    "unavailable",
		"message": fmt.Sprintf("the connection to sandbox %s ended before the stream completed", g.sandboxID),
	}})
	env := make([]byte, envelopeHeader, envelopeHeader+len(msg))
	env[0] = flagEndStream
	binary.BigEndian.PutUint32(env[1:], uint32(len(msg)))
	return append(env, msg...)
}

func (g *streamGuard) Close() error { return g.body.Close() }
