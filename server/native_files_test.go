package server

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	goruntime "runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxd/sandboxd/jwtauth"
	"github.com/sandboxd/sandboxd/openapi/nativeapi"
)

func TestNativeFiles(t *testing.T) {
	e := newNativeEnv(t, true)
	tok := e.full()
	sb := e.create(tok, nil)
	base := "/v1/sandboxes/" + sb.Id + "/files"

	r := e.do(http.MethodPut, base+"?path=/tmp/dir/sub/hello.txt", tok, []byte("hello, world\n"))
	if r.status != 200 {
		t.Fatalf("put = %s; want 200", r)
	}
	var fe nativeapi.FileEntry
	if err := json.Unmarshal(r.body, &fe); err != nil || fe.Path != "/tmp/dir/sub/hello.txt" || fe.Type != "file" || fe.Name != "hello.txt" {
		t.Errorf("put = %s (%v); want the file's entry", r, err)
	}
	if r := e.do(http.MethodGet, base+"?path=/tmp/dir/sub/hello.txt", tok, nil); r.status != 200 || string(r.body) != "hello, world\n" {
		t.Errorf("get = %s; want the content", r)
	}
	if res := e.exec(sb.Id, tok, map[string]any{"cmd": "cat /tmp/dir/sub/hello.txt"}); res.Stdout != "hello, world\n" {
		t.Errorf("cat = %q; want the uploaded content", res.Stdout)
	}
	// A relative path is from the user's home.
	if r := e.do(http.MethodPut, base+"?path=rel.txt&user=root", tok, []byte("r")); r.status != 200 || !json.Valid(r.body) {
		t.Errorf("put relative = %s; want 200", r)
	}
	if r := e.do(http.MethodGet, base+"?path=/root/rel.txt&user=root", tok, nil); r.status != 200 || string(r.body) != "r" {
		t.Errorf("get /root/rel.txt as root = %s; want r", r)
	}
	// Files are read with the user's rights: the default user may not read
	// root's home.
	if r := e.do(http.MethodGet, base+"?path=/root/rel.txt", tok, nil); r.status != http.StatusForbidden {
		t.Errorf("get /root/rel.txt as the default user = %s; want 403", r)
	}

	r = e.do(http.MethodGet, base+"/list?path=/tmp/dir&depth=2", tok, nil)
	var fl nativeapi.FileList
	if err := json.Unmarshal(r.body, &fl); r.status != 200 || err != nil {
		t.Fatalf("list = %s; want 200", r)
	}
	got := map[string]string{}
	for _, en := range fl.Entries {
		got[en.Path] = string(en.Type)
	}
	if got["/tmp/dir/sub"] != "dir" || got["/tmp/dir/sub/hello.txt"] != "file" {
		t.Errorf("list depth 2 = %v; want sub (dir) and sub/hello.txt (file)", got)
	}
	if r := e.do(http.MethodGet, base+"/list?path=/tmp/dir", tok, nil); r.status != 200 || json.Unmarshal(r.body, &fl) != nil || len(fl.Entries) != 1 {
		t.Errorf("list depth 1 = %s; want one entry", r)
	}

	if r := e.do(http.MethodDelete, base+"?path=/tmp/dir", tok, nil); r.status != 204 {
		t.Errorf("delete = %s; want 204", r)
	}
	for _, p := range []string{base + "?path=/tmp/dir/sub/hello.txt", base + "/list?path=/tmp/dir"} {
		if r := e.do(http.MethodGet, p, tok, nil); r.status != 404 || r.errCode() != "not_found" {
			t.Errorf("GET %s after delete = %s; want 404", p, r)
		}
	}
	// Like envd's Remove (and rm -f), deleting a missing path succeeds.
	if r := e.do(http.MethodDelete, base+"?path=/tmp/dir", tok, nil); r.status != 204 {
		t.Errorf("delete again = %s; want 204", r)
	}
	for _, p := range []string{base, base + "/list", base + "?path="} {
		if r := e.do(http.MethodGet, p, tok, nil); r.status != 400 {
			t.Errorf("GET %s = %s; want 400", p, r)
		}
	}
	// A read-only token reads no files.
	ro := e.token("acme", jwtauth.ScopeRead)
	if r := e.do(http.MethodGet, base+"?path=/etc/hostname", ro, nil); r.status != 403 {
		t.Errorf("get with read-only token = %s; want 403", r)
	}
}

// patternReader yields n bytes of a fixed pattern without holding them.
type patternReader struct{ left int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left == 0 {
		return 0, io.EOF
	}
	if int64(len(b)) > p.left {
		b = b[:p.left]
	}
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	p.left -= int64(len(b))
	return len(b), nil
}

// heapPeak samples the heap until stop is called and reports its peak
// above the starting point.
func heapPeak() (stop func() uint64) {
	var ms goruntime.MemStats
	goruntime.GC()
	goruntime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // exits when stop closes done
		defer wg.Done()
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				var ms goruntime.MemStats
				goruntime.ReadMemStats(&ms)
				if ms.HeapInuse > base && ms.HeapInuse-base > peak.Load() {
					peak.Store(ms.HeapInuse - base)
				}
			}
		}
	}()
	return func() uint64 {
		close(done)
		wg.Wait()
		return peak.Load()
	}
}

// TestNativeLargeFile moves 100 MB up and down; the server (in this
// process) streams, so the heap stays far below the file's size.
func TestNativeLargeFile(t *testing.T) {
	if testing.Short() {
		t.Skip("100 MB transfer")
	}
	e := newNativeEnv(t, true)
	tok := e.full()
	sb := e.create(tok, map[string]any{"memory_mb": 512, "disk_mb": 512})
	const size = 100 << 20
	const bound = 32 << 20
	url := e.srv.URL + "/v1/sandboxes/" + sb.Id + "/files?path=/tmp/big"

	want := sha256.New()
	_, _ = io.Copy(want, &patternReader{left: size})

	stop := heapPeak()
	req, _ := http.NewRequest(http.MethodPut, url, &patternReader{left: size})
	req.ContentLength = size
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	up := stop()
	if resp.StatusCode != 200 {
		t.Fatalf("put 100 MB = %d %s; want 200", resp.StatusCode, b)
	}
	if res := e.exec(sb.Id, tok, map[string]any{"cmd": "wc -c < /tmp/big"}); res.Stdout != fmt.Sprintf("%d\n", size) {
		t.Errorf("size in the sandbox = %q; want %d", res.Stdout, size)
	}

	stop = heapPeak()
	req, _ = http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err = e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got := sha256.New()
	n, err := io.Copy(got, resp.Body)
	resp.Body.Close()
	down := stop()
	if err != nil || resp.StatusCode != 200 || n != size {
		t.Fatalf("get 100 MB = %d, %d bytes, %v; want 200, %d bytes", resp.StatusCode, n, err, size)
	}
	if fmt.Sprintf("%x", got.Sum(nil)) != fmt.Sprintf("%x", want.Sum(nil)) {
		t.Error("downloaded bytes differ from the uploaded ones")
	}
	t.Logf("heap peak: upload %d KiB, download %d KiB", up>>10, down>>10)
	if up > bound || down > bound {
		t.Errorf("heap peak upload %d MiB, download %d MiB; want both under %d MiB", up>>20, down>>20, bound>>20)
	}
}
