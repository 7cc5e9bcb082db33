// Package permissions is envd's one door for identity: it turns the user an
// RPC or /files request names into an OS account, and a client path into an
// absolute path as that account sees it.
package permissions

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os/user"
	"strconv"
	"strings"
)

// ErrUnknownUser is returned for a username with no account in the sandbox.
var ErrUnknownUser = errors.New("invalid username")

// User is an OS account resolved for one request.
type User struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32 // supplementary groups, including GID
	Home   string
}

// Lookup resolves name against the sandbox's passwd and group databases.
func Lookup(name string) (*User, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: empty", ErrUnknownUser)
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownUser, name)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q: uid %q: %w", name, u.Uid, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q: gid %q: %w", name, u.Gid, err)
	}
	out := &User{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
	if out.Home == "" {
		out.Home = "/"
	}
	ids, _ := u.GroupIds() // a user without group entries still runs with its primary gid
	seen := map[uint32]bool{}
	for _, s := range append([]string{u.Gid}, ids...) {
		g, err := strconv.ParseUint(s, 10, 32)
		if err != nil || seen[uint32(g)] {
			continue
		}
		seen[uint32(g)] = true
		out.Groups = append(out.Groups, uint32(g))
	}
	return out, nil
}

// UsernameFromBasicAuth returns the username of an `Authorization: Basic
// base64("user:")` header, which is how E2B's SDKs choose the user of an RPC.
// ok is false when the header is absent or not Basic.
func UsernameFromBasicAuth(h http.Header) (name string, ok bool, err error) {
	v := h.Get("Authorization")
	if v == "" {
		return "", false, nil
	}
	scheme, payload, found := strings.Cut(v, " ")
	if !found || !strings.EqualFold(scheme, "basic") {
		return "", false, nil
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(payload))
	if err != nil {
		return "", true, fmt.Errorf("%w: malformed basic auth", ErrUnknownUser)
	}
	name, _, _ = strings.Cut(string(raw), ":")
	return name, true, nil
}
