package auth

import (
	"testing"
	"time"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
)

func TestTokenUnsetNeverMatches(t *testing.T) {
	var tok Token
	if tok.IsSet() || tok.Equal("") {
		t.Fatal("unset token must neither be set nor match the empty string")
	}
	if err := tok.VerifySignature(envdapi.Sign("p", envdapi.OpRead, "", "", 0), "p", envdapi.OpRead, "", "", time.Now()); err == nil {
		t.Fatal("a signature over the empty token must not verify")
	}
	tok.Set("x")
	if !tok.Equal("x") || tok.Equal("y") || tok.Equal("xx") {
		t.Fatal("Equal is wrong")
	}
}
