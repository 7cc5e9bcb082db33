package files

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// Content codings /files speaks. gzip is the only compression E2B's SDKs
// ask for (files.read({gzip}) and gzip uploads).
const (
	codingIdentity = "identity"
	codingGzip     = "gzip"
)

// errNotAcceptable means the client refused every coding we can send.
var errNotAcceptable = errors.New("no acceptable content encoding: supported are gzip and identity")

// accepted holds the qualities an Accept-Encoding header gives the codings
// we care about; -1 means the coding was not listed.
type accepted struct {
	gzip, identity, star float64
}

// parseAccept reads every Accept-Encoding header line (RFC 9110 §12.5.3).
// present is false when the client sent none.
func parseAccept(h http.Header) (a accepted, present bool) {
	a = accepted{gzip: -1, identity: -1, star: -1}
	values := h.Values("Accept-Encoding")
	for _, v := range values {
		for elem := range strings.SplitSeq(v, ",") {
			coding, q, ok := parseCodingElem(elem)
			if !ok {
				continue
			}
			switch coding {
			case codingGzip, "x-gzip":
				a.gzip = max(a.gzip, q)
			case codingIdentity:
				a.identity = max(a.identity, q)
			case "*":
				a.star = max(a.star, q)
			}
		}
	}
	return a, len(values) > 0
}

// identityQ is identity's quality: acceptable unless refused explicitly, or
// by "*;q=0" with no identity entry of its own.
func (a accepted) identityQ() float64 {
	switch {
	case a.identity >= 0:
		return a.identity
	case a.star >= 0:
		return a.star
	}
	return 1
}

// negotiateEncoding picks the response coding. gzip is chosen only when the
// client names it (or refuses identity and allows "*"): a client that sent no
// Accept-Encoding, like the SDKs' plain reads, must get the raw bytes with a
// Content-Length.
func negotiateEncoding(h http.Header) (string, error) {
	a, present := parseAccept(h)
	if !present {
		return codingIdentity, nil
	}
	// Only an identity the client ranked itself (directly or through "*")
	// competes with a gzip it named: "gzip;q=0.5" alone still means gzip.
	ranked := a.identity
	if ranked < 0 {
		ranked = a.star
	}
	idQ := a.identityQ()
	switch {
	case a.gzip > 0 && a.gzip >= ranked:
		return codingGzip, nil
	case idQ > 0:
		return codingIdentity, nil
	case a.gzip < 0 && a.star > 0:
		return codingGzip, nil
	}
	return "", errNotAcceptable
}

// identityAcceptable reports whether the client accepts unencoded bytes at
// all; Range and conditional requests can only be answered that way.
func identityAcceptable(h http.Header) bool {
	a, _ := parseAccept(h)
	return a.identityQ() > 0
}

// parseCodingElem parses one `coding[;q=x]` element. ok is false for an
// empty element or a malformed quality, which is then ignored rather than
// guessed at.
func parseCodingElem(elem string) (coding string, q float64, ok bool) {
	coding, params, _ := strings.Cut(elem, ";")
	coding = strings.ToLower(strings.TrimSpace(coding))
	if coding == "" {
		return "", 0, false
	}
	q = 1
	for p := range strings.SplitSeq(params, ";") {
		name, val, found := strings.Cut(strings.TrimSpace(p), "=")
		if !found || !strings.EqualFold(strings.TrimSpace(name), "q") {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || f < 0 || f > 1 {
			return "", 0, false
		}
		q = f
	}
	return coding, q, true
}

// decodedBody returns the request body with its Content-Encoding removed.
// The caller closes the result; closing it does not close r.Body (the
// server does that).
func decodedBody(r *http.Request) (io.ReadCloser, error) {
	ce := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding")))
	switch ce {
	case "", codingIdentity:
		return io.NopCloser(r.Body), nil
	case codingGzip, "x-gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, fmt.Errorf("%w: gzip request body: %v", rpcerr.ErrInvalidArgument, err)
		}
		return zr, nil
	}
	return nil, fmt.Errorf("%w: unsupported Content-Encoding %q, supported are gzip and identity",
		rpcerr.ErrInvalidArgument, ce)
}
