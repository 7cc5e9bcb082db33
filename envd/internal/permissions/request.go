package permissions

import (
	"errors"
	"fmt"
	"net/http"
	"os/user"

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
	u, err := Lookup(name)
	if errors.Is(err, ErrUnknownUser) && name != "" {
		return nil, unknownFileUser(name)
	}
	return u, err
}

// unknownFileUser is ErrUnknownUser in the words E2B's envd answers /files
// with (os/user's error), which clients may show or compare.
type unknownFileUser string

func (e unknownFileUser) Error() string {
	return fmt.Sprintf("error looking up user '%s': %v", string(e), user.UnknownUserError(e))
}

func (unknownFileUser) Is(target error) bool { return target == ErrUnknownUser }
