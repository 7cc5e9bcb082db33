package domainfilter

import (
	"crypto/tls"
	"net"
	"strings"
	"testing"
)

// clientHello returns the first flight crypto/tls sends for cfg.
func clientHello(t testing.TB, cfg *tls.Config) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	go func() {
		defer b.Close()
		tls.Client(b, cfg).Handshake()
	}()
	buf := make([]byte, 64<<10)
	n, err := a.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// resplit rewrites a single-record ClientHello into records of at most
// size bytes of handshake data each.
func resplit(hello []byte, size int) []byte {
	n := int(hello[3])<<8 | int(hello[4])
	body := hello[5 : 5+n]
	var out []byte
	for len(body) > 0 {
		k := min(size, len(body))
		out = append(out, hello[0], hello[1], hello[2], byte(k>>8), byte(k))
		out = append(out, body[:k]...)
		body = body[k:]
	}
	return out
}

// helloWithSNI builds a minimal ClientHello around an SNI extension body.
func helloWithSNI(sniExt []byte) []byte {
	body := []byte{3, 3}
	body = append(body, make([]byte, 32)...) // random
	body = append(body, 0)                   // session id
	body = append(body, 0, 2, 0x13, 0x01)    // one suite
	body = append(body, 1, 0)                // null compression
	ext := []byte{0, 0, byte(len(sniExt) >> 8), byte(len(sniExt))}
	ext = append(ext, sniExt...)
	body = append(body, byte(len(ext)>>8), byte(len(ext)))
	body = append(body, ext...)
	hs := append([]byte{1, 0, byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{0x16, 3, 1, byte(len(hs) >> 8), byte(len(hs))}, hs...)
}

func sniExt(entries ...string) []byte {
	var list []byte
	for _, e := range entries {
		list = append(list, 0, byte(len(e)>>8), byte(len(e)))
		list = append(list, e...)
	}
	return append([]byte{byte(len(list) >> 8), byte(len(list))}, list...)
}

func TestClientHello(t *testing.T) {
	real := clientHello(t, &tls.Config{ServerName: "Pypi.ORG."})
	noSNI := clientHello(t, &tls.Config{InsecureSkipVerify: true})
	old := clientHello(t, &tls.Config{ServerName: "old.example", MaxVersion: tls.VersionTLS12})
	cases := []struct {
		name string
		in   []byte
		want string
		err  error
	}{
		{"real", real, "pypi.org", nil},
		{"tls 1.2", old, "old.example", nil},
		{"no sni", noSNI, "", nil},
		{"records of 100 bytes", resplit(real, 100), "pypi.org", nil},
		{"records of 1 byte", resplit(real, 1), "pypi.org", nil},
		{"cut short", real[:len(real)-1], "", errNeedMore},
		{"header only", real[:5], "", errNeedMore},
		{"alert record", append([]byte{0x15}, real[1:]...), "", errMalformed},
		{"server hello", append(append([]byte{}, real[:5]...), append([]byte{2}, real[6:]...)...), "", errMalformed},
		{"ssl 2 version", append([]byte{0x16, 2}, real[2:]...), "", errMalformed},
		{"minimal", helloWithSNI(sniExt("a.example")), "a.example", nil},
		{"two names", helloWithSNI(sniExt("a.example", "b.example")), "", errMalformed},
		{"odd bytes in name", helloWithSNI(sniExt("a.example\x00.evil")), "", errMalformed},
		{"empty name", helloWithSNI(sniExt("")), "", errMalformed},
		{"empty list", helloWithSNI([]byte{0, 0}), "", errMalformed},
		{"list overruns", helloWithSNI([]byte{0, 9, 0, 0, 1, 'a'}), "", errMalformed},
		{"zero-length record", []byte{0x16, 3, 1, 0, 0}, "", errMalformed},
		{"huge handshake", []byte{0x16, 3, 1, 0, 4, 1, 0x10, 0, 0}, "", errMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := clientHelloServerName(tc.in)
			if got != tc.want || err != tc.err {
				t.Fatalf("got %q, %v; want %q, %v", got, err, tc.want, tc.err)
			}
			// Every proper prefix is at most incomplete or wrong, never
			// another name.
			for i := range tc.in {
				if n, err := clientHelloServerName(tc.in[:i]); n != "" || err == nil {
					t.Fatalf("prefix %d: %q, %v", i, n, err)
				}
			}
		})
	}
}

func TestHTTPHost(t *testing.T) {
	cases := []struct {
		name string
		in   string
		want string
		err  error
	}{
		{"plain", "GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n", "pypi.org", nil},
		{"port", "GET / HTTP/1.1\r\nhost:PyPI.org.:8080\r\n\r\n", "pypi.org", nil},
		{"ows", "POST /x HTTP/1.0\r\nA: b\r\nHOST: \t pypi.org \r\n\r\nbody", "pypi.org", nil},
		{"v6 literal", "GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n", "2001:db8::1", nil},
		{"v6 without bracket end", "GET / HTTP/1.1\r\nHost: [2001:db8::1\r\n\r\n", "", errMalformed},
		{"bad port", "GET / HTTP/1.1\r\nHost: a.org:x\r\n\r\n", "", errMalformed},
		{"no host", "GET / HTTP/1.0\r\n\r\n", "", nil},
		{"two hosts", "GET / HTTP/1.1\r\nHost: a.org\r\nHost: b.org\r\n\r\n", "", errMalformed},
		{"folded", "GET / HTTP/1.1\r\nHost: a.org\r\n b.org\r\n\r\n", "", errMalformed},
		{"space before colon", "GET / HTTP/1.1\r\nHost : a.org\r\n\r\n", "", errMalformed},
		{"odd host", "GET / HTTP/1.1\r\nHost: a.org/evil\r\n\r\n", "", errMalformed},
		{"absolute uri agrees", "GET http://a.org/x HTTP/1.1\r\nHost: a.org\r\n\r\n", "a.org", nil},
		{"absolute uri differs", "GET http://u@b.org:80/x HTTP/1.1\r\nHost: a.org\r\n\r\n", "", errMalformed},
		{"incomplete", "GET / HTTP/1.1\r\nHost: a.org\r\n", "", errNeedMore},
		{"request line only so far", "GET / HT", "", errNeedMore},
		{"http 2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "", errMalformed},
		{"not http", "SSH-2.0-x\r\n", "", errMalformed},
		{"lowercase method", "get / HTTP/1.1\r\n\r\n", "", errMalformed},
		{"no version", "GET /\r\nHost: a.org\r\n\r\n", "", errMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := httpHost([]byte(tc.in))
			if got != tc.want || err != tc.err {
				t.Fatalf("got %q, %v; want %q, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestCanonicalHost(t *testing.T) {
	for in, want := range map[string]string{
		"PyPI.org.":                   "pypi.org",
		"a..b":                        "",
		".a":                          "",
		"a.b..":                       "",
		"":                            "",
		"x_y-z.example":               "x_y-z.example",
		"é.example":                   "",
		strings.Repeat("a", 64):       "",
		strings.Repeat("a.", 128):     "",
		strings.Repeat("a", 63) + ".": strings.Repeat("a", 63),
	} {
		if got := canonicalHost(in); got != want {
			t.Errorf("canonicalHost(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzClientHello(f *testing.F) {
	real := clientHello(f, &tls.Config{ServerName: "pypi.org"})
	f.Add(real)
	f.Add(resplit(real, 7))
	f.Add(clientHello(f, &tls.Config{InsecureSkipVerify: true}))
	f.Add(clientHello(f, &tls.Config{ServerName: "a.b", MaxVersion: tls.VersionTLS12}))
	f.Add(helloWithSNI(sniExt("a.example", "b.example")))
	f.Add(helloWithSNI([]byte{0, 9, 0, 0, 1, 'a'}))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 40})
	f.Fuzz(func(t *testing.T, b []byte) {
		name, err := clientHelloServerName(b)
		if name != "" && (err != nil || canonicalHost(name) != name) {
			t.Fatalf("%q, %v", name, err)
		}
		proto, host, _ := sniff(b)
		if host != "" && proto == protoTCP {
			t.Fatal("a host from neither TLS nor HTTP")
		}
	})
}

func FuzzHTTPHost(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
		"GET http://a@b:1/ HTTP/1.1\r\nhost: b:1\r\n\r\n",
		"POST / HTTP/1.0\r\nX: y\r\n Host: a\r\n\r\n",
		"GET / HTTP/1.1\r\n",
		"CONNECT a.org:443 HTTP/1.1\r\nHost: a.org:443\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		host, err := httpHost(b)
		if host != "" && err != nil {
			t.Fatalf("%q with %v", host, err)
		}
		if host != "" && canonicalHost(host) != host && !strings.Contains(host, ":") {
			t.Fatalf("uncanonical %q", host)
		}
		sniff(b)
	})
}
