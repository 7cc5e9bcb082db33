package certpin

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"testing"
	"time"
)

func selfSigned(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestVerifier(t *testing.T) {
	a, b := selfSigned(t, "a"), selfSigned(t, "b")
	derA, err := DER(a)
	if err != nil {
		t.Fatal(err)
	}
	derB, _ := DER(b)
	verify, err := Verifier(a)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		raw  [][]byte
		ok   bool
	}{
		{"pinned", [][]byte{derA}, true},
		{"pinned leaf of a chain", [][]byte{derA, derB}, true},
		{"other", [][]byte{derB}, false},
		{"pinned as intermediate only", [][]byte{derB, derA}, false},
		{"none", nil, false},
	} {
		if err := verify(tc.raw, nil); (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrMismatch)) {
			t.Errorf("%s: verify = %v; want ok %v", tc.name, err, tc.ok)
		}
	}
	if !Match([][]byte{derB}, derA, derB) {
		t.Error("Match with the second of two pins = false")
	}
}

func TestDERErrors(t *testing.T) {
	key := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte{1}})
	for name, in := range map[string][]byte{
		"empty":   nil,
		"not PEM": []byte("hello"),
		"a key":   key,
		"garbage": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2, 3}}),
	} {
		if _, err := DER(in); err == nil {
			t.Errorf("DER(%s) succeeded", name)
		}
		if _, err := Verifier(in); err == nil {
			t.Errorf("Verifier(%s) succeeded", name)
		}
	}
}
