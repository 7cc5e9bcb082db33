package permissions

import (
	"net/http"

	"github.com/sandboxd/sandboxd/envd/internal/execctx"
)

// RequestUser resolves the user an RPC runs as: the Basic-auth username when
// the client chose one, else the sandbox default user.
func RequestUser(h http.Header, d *execctx.Defaults) (*User, error) {
	name, ok, err := UsernameFromBasicAuth(h)
	if err != nil {
		return nil, err
	}
	if !ok || name == "" {
		name = d.User()
	}
	return Lookup(name)
}

// NamedUser resolves the user of a plain-HTTP request (the `username` query
// parameter of /files), falling back to the sandbox default user.
func NamedUser(name string, d *execctx.Defaults) (*User, error) {
	if name == "" {
		name = d.User()
	}
	return Lookup(name)
}
