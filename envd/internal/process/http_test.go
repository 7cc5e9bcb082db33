package process

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"testing"
)

// The Python SDK speaks Connect over plain HTTP/1.1: check the envelope
// framing byte by byte.
func TestStartOverHTTP1RawEnvelopes(t *testing.T) {
	e := newTestEnv(t)
	body := []byte(`{"process":{"cmd":"/bin/sh","args":["-c","echo hi; echo oops >&2"],"envs":{}},"stdin":false}`)
	var req bytes.Buffer
	req.WriteByte(0)
	_ = binary.Write(&req, binary.BigEndian, uint32(len(body)))
	req.Write(body)

	r, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.url+"/process.Process/Start", &req)
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/connect+json")
	r.Header.Set("Connect-Protocol-Version", "1")
	r.Header.Set("Keepalive-Ping-Interval", "50")
	tr := &http.Transport{} // HTTP/1.1 only on cleartext
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr}).Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ProtoMajor != 1 || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/connect+json" {
		t.Fatalf("response %s %d %q", resp.Proto, resp.StatusCode, resp.Header.Get("Content-Type"))
	}

	type frame struct {
		flag    byte
		payload []byte
	}
	var frames []frame
	br := bufio.NewReader(resp.Body)
	for {
		var head [5]byte
		if _, err := io.ReadFull(br, head[:]); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("read frame header: %v", err)
		}
		payload := make([]byte, binary.BigEndian.Uint32(head[1:]))
		if _, err := io.ReadFull(br, payload); err != nil {
			t.Fatalf("read frame: %v", err)
		}
		frames = append(frames, frame{head[0], payload})
	}
	if len(frames) < 3 {
		t.Fatalf("got %d frames; want start, data..., end, end-of-stream", len(frames))
	}

	var first struct {
		Event struct {
			Start *struct {
				Pid uint32 `json:"pid"`
			} `json:"start"`
		} `json:"event"`
	}
	if err := json.Unmarshal(frames[0].payload, &first); err != nil || frames[0].flag != 0 || first.Event.Start == nil || first.Event.Start.Pid == 0 {
		t.Fatalf("first frame = %x %s; want a start event with a pid", frames[0].flag, frames[0].payload)
	}
	last := frames[len(frames)-1]
	if last.flag != 0x02 || string(bytes.TrimSpace(last.payload)) != "{}" {
		t.Fatalf("last frame = %x %s; want flag 0x02 with {}", last.flag, last.payload)
	}
	var end struct {
		Event struct {
			End *struct {
				ExitCode int    `json:"exitCode"`
				Exited   bool   `json:"exited"`
				Status   string `json:"status"`
			} `json:"end"`
		} `json:"event"`
	}
	penultimate := frames[len(frames)-2]
	if err := json.Unmarshal(penultimate.payload, &end); err != nil || end.Event.End == nil || !end.Event.End.Exited || end.Event.End.Status != "exit status 0" {
		t.Fatalf("frame before end-of-stream = %s; want the end event", penultimate.payload)
	}
	var stdout, stderr []byte
	for _, f := range frames[1 : len(frames)-2] {
		var data struct {
			Event struct {
				Data *struct {
					Stdout []byte `json:"stdout"`
					Stderr []byte `json:"stderr"`
				} `json:"data"`
			} `json:"event"`
		}
		if err := json.Unmarshal(f.payload, &data); err != nil || f.flag != 0 || data.Event.Data == nil {
			t.Fatalf("middle frame = %x %s; want a data event", f.flag, f.payload)
		}
		stdout = append(stdout, data.Event.Data.Stdout...)
		stderr = append(stderr, data.Event.Data.Stderr...)
	}
	if string(stdout) != "hi\n" || string(stderr) != "oops\n" {
		t.Fatalf("stdout %q stderr %q", stdout, stderr)
	}
}
