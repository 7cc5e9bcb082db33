// Package tenant names the owner of every sandbox, key and quota in sandboxd,
// carries that owner through a request's context, and defines its settings:
// pool size, quotas and the rate limit of each route class (Settings), what
// is unset in them, how they are validated and how they merge over the
// server defaults (Effective). The store persists Settings; packages
// ratelimit and sandbox and the CLI read them.
//
// The authentication middleware resolves an API key to an ID and stores it with
// WithContext; handlers and everything below them read it with FromContext.
// The context key is unexported, so no other package can forge or overwrite it
// by accident.
package tenant

import "context"

// ID identifies a tenant. It is the tenant's name as created in the store
// (for example "default" or "team-a"); names are immutable.
type ID string

// String returns the ID as a plain string.
func (id ID) String() string { return string(id) }

// ctxKey is the unexported type of the context key, so the value can only be
// set and read through this package.
type ctxKey struct{}

// WithContext returns a copy of ctx that carries id.
func WithContext(ctx context.Context, id ID) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the tenant stored in ctx by WithContext. ok is false if
// ctx carries no tenant or an empty one.
func FromContext(ctx context.Context) (id ID, ok bool) {
	id, ok = ctx.Value(ctxKey{}).(ID)
	return id, ok && id != ""
}
