// Package permissions is envd's one door for identity: it turns the user an
// RPC or /files request names into an OS account, and a client path into an
// absolute path as that account sees it.
package permissions

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/user"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
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
		return nil, fmt.Errorf("%w: '%s'", ErrUnknownUser, name) // E2B envd's words
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

// AsUser runs fn with u's filesystem identity (fsuid, fsgid and
// supplementary groups), so that what fn opens, creates, lists or removes is
// checked by the kernel as for a shell of u: envd is root, and a request that
// names a user must not read /etc/shadow or write into /root through it.
// Files fn creates are owned by u from the start.
//
// Credentials are per thread in Linux, so fn runs on a goroutine locked to
// its own OS thread that never unlocks it: when the goroutine ends the
// runtime ends the thread too, and no other goroutine ever runs with u's
// identity (and threads the runtime starts meanwhile come from its template
// thread, not this one). fn must do its file work on the calling goroutine.
//
// root needs no switch, and an envd that is not root cannot switch at all:
// the kernel already limits it to its own rights, so fn runs as is.
func AsUser(u *User, fn func() error) error {
	if u.UID == 0 || os.Geteuid() != 0 {
		return fn()
	}
	type result struct {
		err   error
		panic any
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		var res result
		defer func() {
			res.panic = recover()
			done <- res
		}()
		if err := becomeUser(u); err != nil {
			res.err = err
			return
		}
		res.err = fn()
	}()
	res := <-done
	if res.panic != nil {
		panic(res.panic) // on the caller's goroutine, where net/http recovers it
	}
	return res.err
}

// becomeUser switches the calling thread's filesystem identity to u. Groups
// first: setgroups needs CAP_SETGID, which a non-zero fsuid keeps but is
// easier to reason about before it.
func becomeUser(u *User) error {
	gids := make([]int, len(u.Groups))
	for i, g := range u.Groups {
		gids[i] = int(g)
	}
	if err := unix.Setgroups(gids); err != nil {
		return fmt.Errorf("run as %s: setgroups: %w", u.Name, err)
	}
	// setfsuid and setfsgid report failure only by not changing the id:
	// read it back.
	_, _ = unix.SetfsgidRetGid(int(u.GID))
	if got, _ := unix.SetfsgidRetGid(-1); got != int(u.GID) {
		return fmt.Errorf("run as %s: setfsgid(%d) left fsgid %d", u.Name, u.GID, got)
	}
	_, _ = unix.SetfsuidRetUid(int(u.UID))
	if got, _ := unix.SetfsuidRetUid(-1); got != int(u.UID) {
		return fmt.Errorf("run as %s: setfsuid(%d) left fsuid %d", u.Name, u.UID, got)
	}
	return nil
}
