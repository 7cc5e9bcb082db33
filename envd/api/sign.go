package envdapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"strconv"
	"time"
)

// Operations named in a /files signature.
const (
	OpRead  = "read"
	OpWrite = "write"
)

// Errors of VerifySignature, which envd answers with 401 and the control
// plane branches on. Their texts are E2B's envd's, word for word: /files
// answers them as the message of its 401, and the SDKs' tests compare it.
var (
	ErrMissingSignature = errors.New("missing signature query parameter")
	ErrBadSignature     = errors.New("invalid signature")
	ErrExpiredSignature = errors.New("signature is already expired")
)

// Sign returns the signature E2B's SDKs compute for a pre-signed /files URL:
// "v1_" + unpadded base64 of SHA-256 over "path:op:user:token[:expiration]".
// expiration is unix seconds, or 0 for none.
func Sign(path, op, user, token string, expiration int64) string {
	s := path + ":" + op + ":" + user + ":" + token
	if expiration != 0 {
		s += ":" + strconv.FormatInt(expiration, 10)
	}
	sum := sha256.Sum256([]byte(s))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// VerifySignature checks a /files signature against token, the sandbox's
// access token ("" fails: there is nothing to sign with). expiration is the
// raw `signature_expiration` query value ("" for none).
func VerifySignature(signature, path, op, user, token, expiration string, now time.Time) error {
	if signature == "" {
		return ErrMissingSignature
	}
	if token == "" {
		return ErrBadSignature
	}
	var exp int64
	if expiration != "" {
		var err error
		exp, err = strconv.ParseInt(expiration, 10, 64)
		if err != nil || exp <= 0 {
			return ErrBadSignature
		}
	}
	want := Sign(path, op, user, token, exp)
	if subtle.ConstantTimeCompare([]byte(want), []byte(signature)) != 1 {
		return ErrBadSignature
	}
	if exp != 0 && now.Unix() > exp {
		return ErrExpiredSignature
	}
	return nil
}
