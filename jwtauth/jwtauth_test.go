package jwtauth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

var secret = []byte("0123456789abcdef0123456789abcdef")

func sign(t *testing.T, m jwt.SigningMethod, key any, kid string, c jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestIssueVerify(t *testing.T) {
	tok, err := Issue(secret, "acme", []string{ScopeRead, ScopeWrite}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewVerifier(secret, nil).Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if c.Tenant != "acme" || !c.Has(ScopeRead) || !c.Has(ScopeWrite) {
		t.Errorf("Verify = %+v; want tenant acme with both scopes", c)
	}
}

func TestVerifyRefuses(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	_, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	now := time.Now()
	ok := jwt.MapClaims{"sub": "acme", "scope": ScopeRead, "exp": now.Add(time.Hour).Unix()}
	good := sign(t, jwt.SigningMethodHS256, secret, "", ok)
	parts := strings.Split(good, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	forged := strings.Replace(string(payload), "acme", "evil", 1)
	tampered := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(forged)) + "." + parts[2]

	cases := map[string]string{
		"expired":       sign(t, jwt.SigningMethodHS256, secret, "", jwt.MapClaims{"sub": "acme", "exp": now.Add(-time.Minute).Unix()}),
		"no exp":        sign(t, jwt.SigningMethodHS256, secret, "", jwt.MapClaims{"sub": "acme"}),
		"no sub":        sign(t, jwt.SigningMethodHS256, secret, "", jwt.MapClaims{"exp": now.Add(time.Hour).Unix()}),
		"not yet valid": sign(t, jwt.SigningMethodHS256, secret, "", jwt.MapClaims{"sub": "acme", "exp": now.Add(time.Hour).Unix(), "nbf": now.Add(time.Hour).Unix()}),
		"wrong secret":  sign(t, jwt.SigningMethodHS256, []byte("another-secret-another-secret-xx"), "", ok),
		"tampered":      tampered,
		"alg none":      sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "", ok),
		"HS512":         sign(t, jwt.SigningMethodHS512, secret, "", ok),
		"RS256 no jwks": sign(t, jwt.SigningMethodRS256, rsaKey, "k1", ok),
		"EdDSA no jwks": sign(t, jwt.SigningMethodEdDSA, edPriv, "k2", ok),
		"garbage":       "not.a.jwt",
		"empty":         "",
	}
	v := NewVerifier(secret, nil)
	for name, tok := range cases {
		t.Run(name, func(t *testing.T) {
			if c, err := v.Verify(tok); !errors.Is(err, ErrInvalid) {
				t.Errorf("Verify = %+v, %v; want ErrInvalid", c, err)
			}
		})
	}
	// Within the leeway, an expired token still passes.
	skew := sign(t, jwt.SigningMethodHS256, secret, "", jwt.MapClaims{"sub": "acme", "exp": now.Add(-5 * time.Second).Unix()})
	if _, err := v.Verify(skew); err != nil {
		t.Errorf("Verify(expired 5s ago) = %v; want nil (leeway %s)", err, Leeway)
	}
	// A disabled verifier refuses even a good token.
	if _, err := NewVerifier(nil, nil).Verify(good); !errors.Is(err, ErrInvalid) {
		t.Errorf("disabled Verify = %v; want ErrInvalid", err)
	}
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func TestJWKS(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	edPub, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	otherRSA, _ := rsa.GenerateKey(rand.Reader, 2048)
	doc, _ := json.Marshal(map[string]any{"keys": []map[string]string{
		{"kty": "RSA", "kid": "r1", "use": "sig", "n": b64(rsaKey.N.Bytes()), "e": b64(big.NewInt(int64(rsaKey.E)).Bytes())},
		{"kty": "OKP", "crv": "Ed25519", "kid": "e1", "x": b64(edPub)},
		{"kty": "EC", "kid": "skipped"},
	}})
	path := filepath.Join(t.TempDir(), "jwks.json")
	if err := writeFile(path, doc); err != nil {
		t.Fatal(err)
	}
	set, err := LoadJWKS(path)
	if err != nil {
		t.Fatal(err)
	}
	v := NewVerifier(nil, set)
	c := jwt.MapClaims{"sub": "idp-tenant", "scope": "sandboxes:write", "exp": time.Now().Add(time.Hour).Unix()}
	for _, tc := range []struct {
		name string
		tok  string
		ok   bool
	}{
		{"RS256", sign(t, jwt.SigningMethodRS256, rsaKey, "r1", c), true},
		{"EdDSA", sign(t, jwt.SigningMethodEdDSA, edPriv, "e1", c), true},
		{"RS256 other key", sign(t, jwt.SigningMethodRS256, otherRSA, "r1", c), false},
		{"RS256 unknown kid", sign(t, jwt.SigningMethodRS256, rsaKey, "nope", c), false},
		{"EdDSA under RSA kid", sign(t, jwt.SigningMethodEdDSA, edPriv, "r1", c), false},
		{"HS256 without secret", sign(t, jwt.SigningMethodHS256, secret, "", c), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := v.Verify(tc.tok)
			if (err == nil) != tc.ok {
				t.Fatalf("Verify = %+v, %v; want ok=%v", got, err, tc.ok)
			}
			if tc.ok && (got.Tenant != "idp-tenant" || !got.Has(ScopeWrite) || got.Has(ScopeRead)) {
				t.Errorf("Verify = %+v; want idp-tenant with write only", got)
			}
		})
	}
	if _, err := ParseJWKS([]byte(`{"keys":[]}`)); err == nil {
		t.Error("ParseJWKS(empty) = nil error; want an error")
	}
}

func TestLoadOrCreateSecret(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jwt.secret")
	a, err := LoadOrCreateSecret(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreateSecret(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(a) != string(b) || len(a) < 32 {
		t.Errorf("secrets %q, %q; want the same, at least 32 chars", a, b)
	}
}
