package envdapi

import (
	"errors"
	"testing"
	"time"
)

// The vectors were computed independently (Python hashlib) from the
// signature recipe E2B's SDKs use.
func TestSign(t *testing.T) {
	tests := []struct {
		path, op, user, token string
		exp                   int64
		want                  string
	}{
		{"/home/user/a.txt", OpRead, "user", "tok123", 0, "v1_HB2bgZ+RgifWQVkD4WDT8wNBFTVrggZWSRD5EqI0H/0"},
		{"a b.txt", OpWrite, "", "tok123", 1700000000, "v1_RCDe8x/U77N8sZBHqLlnue3vjoARpt3sln+BoT8ywJM"},
	}
	for _, tt := range tests {
		if got := Sign(tt.path, tt.op, tt.user, tt.token, tt.exp); got != tt.want {
			t.Errorf("Sign(%q, %q, %q, _, %d) = %q; want %q", tt.path, tt.op, tt.user, tt.exp, got, tt.want)
		}
	}
}

func TestVerifySignature(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	good := Sign("f.txt", OpRead, "", "secret", 0)
	future := Sign("f.txt", OpRead, "", "secret", now.Unix()+60)
	past := Sign("f.txt", OpRead, "", "secret", now.Unix()-1)
	tests := []struct {
		name, sig, path, op, user, exp string
		want                           error
	}{
		{"valid", good, "f.txt", OpRead, "", "", nil},
		{"valid with expiry", future, "f.txt", OpRead, "", "1800000060", nil},
		{"expired", past, "f.txt", OpRead, "", "1799999999", ErrExpiredSignature},
		{"missing", "", "f.txt", OpRead, "", "", ErrMissingSignature},
		{"other path", good, "g.txt", OpRead, "", "", ErrBadSignature},
		{"other op", good, "f.txt", OpWrite, "", "", ErrBadSignature},
		{"other user", good, "f.txt", OpRead, "root", "", ErrBadSignature},
		{"expiry stripped", future, "f.txt", OpRead, "", "", ErrBadSignature},
		{"expiry not a number", future, "f.txt", OpRead, "", "soon", ErrBadSignature},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := VerifySignature(tt.sig, tt.path, tt.op, tt.user, "secret", tt.exp, now)
			if !errors.Is(err, tt.want) {
				t.Errorf("VerifySignature = %v; want %v", err, tt.want)
			}
		})
	}
}
