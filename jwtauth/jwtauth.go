// Package jwtauth verifies and issues the JWTs of sandboxd's native API:
// HS256 with a server secret, and RS256 or EdDSA with public keys from a JWKS
// file (deployments with an identity provider). A token's `sub` is the
// tenant, its `scope` a space-separated list of scopes; `exp` is required.
package jwtauth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Scopes of the native API.
const (
	ScopeRead  = "sandboxes:read"
	ScopeWrite = "sandboxes:write"
)

// Leeway is the clock skew accepted on exp, nbf and iat.
const Leeway = 30 * time.Second

// ErrInvalid wraps every reason a token is refused.
var ErrInvalid = errors.New("invalid token")

// Claims is what sandboxd reads from a token.
type Claims struct {
	Tenant string
	Scopes []string
	Expiry time.Time
}

// Has reports whether the claims grant scope.
func (c Claims) Has(scope string) bool { return slices.Contains(c.Scopes, scope) }

// claims is the JWT body: registered claims plus `scope` (RFC 8693 style).
type claims struct {
	jwt.RegisteredClaims
	Scope string `json:"scope"`
}

// Verifier checks tokens. The zero value refuses everything.
type Verifier struct {
	secret []byte         // HS256; nil = HS256 off
	keys   map[string]any // kid -> *rsa.PublicKey or ed25519.PublicKey
}

// NewVerifier returns a verifier for HS256 tokens signed with secret (nil to
// disable) and for RS256/EdDSA tokens signed by a key of jwks (may be nil).
func NewVerifier(secret []byte, jwks *JWKS) *Verifier {
	v := &Verifier{secret: secret, keys: map[string]any{}}
	if jwks != nil {
		for kid, k := range jwks.keys {
			v.keys[kid] = k
		}
	}
	return v
}

// Enabled reports whether any key is configured.
func (v *Verifier) Enabled() bool { return v != nil && (len(v.secret) > 0 || len(v.keys) > 0) }

// Verify parses and checks a token.
func (v *Verifier) Verify(token string) (Claims, error) {
	if !v.Enabled() {
		return Claims{}, fmt.Errorf("%w: JWT authentication is not configured", ErrInvalid)
	}
	var c claims
	_, err := jwt.ParseWithClaims(token, &c, v.key,
		jwt.WithValidMethods([]string{"HS256", "RS256", "EdDSA"}),
		jwt.WithExpirationRequired(), jwt.WithLeeway(Leeway), jwt.WithIssuedAt())
	if err != nil {
		return Claims{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if c.Subject == "" {
		return Claims{}, fmt.Errorf("%w: no sub (tenant)", ErrInvalid)
	}
	return Claims{Tenant: c.Subject, Scopes: strings.Fields(c.Scope), Expiry: c.ExpiresAt.Time}, nil
}

// key picks the verification key by algorithm and kid; an algorithm never
// gets a key of another family (no HS256 with an RSA public key as secret).
func (v *Verifier) key(t *jwt.Token) (any, error) {
	switch t.Method.Alg() {
	case "HS256":
		if len(v.secret) == 0 {
			return nil, errors.New("HS256 tokens are not accepted")
		}
		return v.secret, nil
	case "RS256", "EdDSA":
		kid, _ := t.Header["kid"].(string)
		k, ok := v.keys[kid]
		if !ok && kid == "" && len(v.keys) == 1 {
			for _, only := range v.keys {
				k, ok = only, true
			}
		}
		if !ok {
			return nil, fmt.Errorf("unknown key id %q", kid)
		}
		switch k.(type) {
		case *rsa.PublicKey:
			if t.Method.Alg() != "RS256" {
				return nil, errors.New("key type does not match alg")
			}
		case ed25519.PublicKey:
			if t.Method.Alg() != "EdDSA" {
				return nil, errors.New("key type does not match alg")
			}
		}
		return k, nil
	}
	return nil, fmt.Errorf("algorithm %s is not accepted", t.Method.Alg())
}

// Issue signs an HS256 token for tenant with scopes, valid for ttl.
func Issue(secret []byte, tenant string, scopes []string, ttl time.Duration) (string, error) {
	return IssueAt(secret, tenant, scopes, time.Now(), ttl)
}

// IssueAt is Issue with the issue time given (tests make expired tokens).
func IssueAt(secret []byte, tenant string, scopes []string, now time.Time, ttl time.Duration) (string, error) {
	if len(secret) == 0 {
		return "", errors.New("no secret")
	}
	if tenant == "" {
		return "", errors.New("no tenant")
	}
	if ttl <= 0 {
		return "", errors.New("ttl must be positive")
	}
	c := claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   tenant,
			Issuer:    "sandboxd",
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
		},
		Scope: strings.Join(scopes, " "),
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString(secret)
}

// LoadOrCreateSecret reads the HS256 secret at path, creating a random one
// (mode 0600) if the file does not exist.
func LoadOrCreateSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		s := strings.TrimSpace(string(b))
		if len(s) < 32 {
			return nil, fmt.Errorf("JWT secret %s: shorter than 32 characters", path)
		}
		return []byte(s), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("JWT secret: %w", err)
	}
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	s := base64.RawURLEncoding.EncodeToString(raw)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return LoadOrCreateSecret(path) // another process won the race
	}
	if err != nil {
		return nil, fmt.Errorf("JWT secret: %w", err)
	}
	if _, err := f.WriteString(s + "\n"); err != nil {
		f.Close()
		return nil, fmt.Errorf("JWT secret: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("JWT secret: %w", err)
	}
	return []byte(s), nil
}

// JWKS is a set of public keys (RFC 7517): RSA, and OKP with crv Ed25519.
type JWKS struct {
	keys map[string]any
}

type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
}

// ParseJWKS reads a JWKS document; keys of other types are skipped.
func ParseJWKS(raw []byte) (*JWKS, error) {
	var doc struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("JWKS: %w", err)
	}
	set := &JWKS{keys: map[string]any{}}
	for i, k := range doc.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		switch {
		case k.Kty == "RSA":
			n, err1 := base64.RawURLEncoding.DecodeString(k.N)
			e, err2 := base64.RawURLEncoding.DecodeString(k.E)
			if err := errors.Join(err1, err2); err != nil || len(n) == 0 || len(e) == 0 || len(e) > 4 {
				return nil, fmt.Errorf("JWKS key %d: bad RSA key", i)
			}
			set.keys[k.Kid] = &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
		case k.Kty == "OKP" && k.Crv == "Ed25519":
			x, err := base64.RawURLEncoding.DecodeString(k.X)
			if err != nil || len(x) != ed25519.PublicKeySize {
				return nil, fmt.Errorf("JWKS key %d: bad Ed25519 key", i)
			}
			set.keys[k.Kid] = ed25519.PublicKey(x)
		}
	}
	if len(set.keys) == 0 {
		return nil, errors.New("JWKS: no usable signing key")
	}
	return set, nil
}

// LoadJWKS reads a JWKS file.
func LoadJWKS(path string) (*JWKS, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseJWKS(raw)
}
