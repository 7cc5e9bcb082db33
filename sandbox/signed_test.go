package sandbox

import (
	"context"
	"net/url"
	"strconv"
	"testing"
	"testing/synctest"

	envdapi "github.com/sandboxd/sandboxd/envd/api"
)

func TestSignedFileSandbox(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newTestEnv(t, nil)
		a, err := e.m.Create(as("a"), CreateRequest{Secure: true})
		if err != nil {
			t.Fatal(err)
		}
		b, err := e.m.Create(as("a"), CreateRequest{Secure: true})
		if err != nil {
			t.Fatal(err)
		}
		exp := strconv.FormatInt(e.m.now().Unix()+60, 10)
		q := func(path, op, user, token, exp string) url.Values {
			n, _ := strconv.ParseInt(exp, 10, 64)
			v := url.Values{"path": {path}, "signature": {envdapi.Sign(path, op, user, token, n)}}
			if user != "" {
				v.Set("username", user)
			}
			if exp != "" {
				v.Set("signature_expiration", exp)
			}
			return v
		}
		tests := []struct {
			name string
			q    url.Values
			op   string
			want string
		}{
			{"a, read", q("/home/user/f", "read", "", a.EnvdAccessToken, ""), "read", a.ID},
			{"b, write with user and expiry", q("f", "write", "user", b.EnvdAccessToken, exp), "write", b.ID},
			{"wrong operation", q("f", "write", "", a.EnvdAccessToken, ""), "read", ""},
			{"unknown token", q("f", "read", "", "nope", ""), "read", ""},
			{"no signature", url.Values{"path": {"f"}}, "read", ""},
		}
		for _, tt := range tests {
			if got := e.m.SignedFileSandbox(context.Background(), tt.q, tt.op); got != tt.want {
				t.Errorf("%s: SignedFileSandbox = %q; want %q", tt.name, got, tt.want)
			}
		}
	})
}
