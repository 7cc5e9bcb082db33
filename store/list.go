package store

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxd/sandboxd/tenant"
)

// Order is the order of a sandbox listing by start time (ties by ID).
type Order string

// Orders. The zero Order is OrderDesc, E2B's default.
const (
	OrderAsc  Order = "asc"
	OrderDesc Order = "desc"
)

// DefaultListLimit is the page size when ListFilter.Limit is zero.
const DefaultListLimit = 100

// ListFilter selects and pages a tenant's sandboxes. Conditions combine with
// AND.
type ListFilter struct {
	Tenant       tenant.ID         // required
	States       []State           // empty: every live state
	Metadata     map[string]string // every pair must be in the sandbox's metadata
	StartedAfter time.Time         // zero: no bound; otherwise started strictly after
	Template     string            // template ID or alias; empty: any
	Order        Order             // empty: OrderDesc
	Limit        int               // page size; 0: DefaultListLimit
	Cursor       string            // a next-page token from the previous call; empty: first page
}

// ListSandboxes returns one page of the sandboxes f selects, ordered by start
// time then ID, and the token for the next page ("" on the last page). The
// token is opaque to callers and carries the position, not a snapshot:
// sandboxes started or stopped between pages appear or vanish as they would
// in a fresh listing, but none is returned twice. A token from another order
// or a malformed one is ErrInvalid.
func (s *Store) ListSandboxes(ctx context.Context, f ListFilter) ([]Sandbox, string, error) {
	q, args, limit, order, err := f.query(s.dialect)
	if err != nil {
		return nil, "", fmt.Errorf("list sandboxes: %w", err)
	}
	sbs, err := s.query(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("list sandboxes of %s: %w", f.Tenant, err)
	}
	if len(sbs) <= limit {
		return sbs, "", nil
	}
	sbs = sbs[:limit]
	last := sbs[limit-1]
	return sbs, cursor{order: order, started: unixNano(last.StartedAt), id: last.ID}.encode(), nil
}

// query builds the statement for f; it selects one row more than the page
// size, to tell whether a next page exists.
func (f ListFilter) query(d dialect) (q string, args []any, limit int, order Order, err error) {
	if f.Tenant == "" {
		return "", nil, 0, "", fmt.Errorf("%w: no tenant", ErrInvalid)
	}
	order = f.Order
	if order == "" {
		order = OrderDesc
	}
	if order != OrderAsc && order != OrderDesc {
		return "", nil, 0, "", fmt.Errorf("%w: order %q", ErrInvalid, f.Order)
	}
	limit = f.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	if limit < 0 {
		return "", nil, 0, "", fmt.Errorf("%w: limit %d", ErrInvalid, f.Limit)
	}

	var b strings.Builder
	b.WriteString(`SELECT ` + sandboxCols + ` FROM sandboxes WHERE tenant_id = ?`)
	args = append(args, f.Tenant)

	states := f.States
	if len(states) == 0 {
		states = liveStates
	}
	b.WriteString(` AND state IN (` + placeholders(len(states)) + `)`)
	for _, st := range states {
		if !st.Valid() {
			return "", nil, 0, "", fmt.Errorf("%w: state %q", ErrInvalid, st)
		}
		args = append(args, string(st))
	}

	// Times outside Unix nanoseconds' range clamp: a bound before 1678 is no
	// bound, one after 2262 excludes everything.
	if after := f.StartedAfter; after.Year() >= 1678 {
		n := int64(math.MaxInt64)
		if after.Year() < 2262 {
			n = unixNano(after)
		}
		b.WriteString(` AND started_at > ?`)
		args = append(args, n)
	}
	if f.Template != "" {
		b.WriteString(` AND (template = ? OR alias = ?)`)
		args = append(args, f.Template, f.Template)
	}
	for _, k := range slices.Sorted(maps.Keys(f.Metadata)) {
		b.WriteString(` AND ` + d.metadataMatch())
		args = append(args, k, f.Metadata[k])
	}

	cmp, dir := ">", "ASC"
	if order == OrderDesc {
		cmp, dir = "<", "DESC"
	}
	if f.Cursor != "" {
		c, err := decodeCursor(f.Cursor)
		if err != nil {
			return "", nil, 0, "", err
		}
		if c.order != order {
			return "", nil, 0, "", fmt.Errorf("%w: next token is for order %s", ErrInvalid, c.order)
		}
		b.WriteString(` AND (started_at, id) ` + cmp + ` (?, ?)`)
		args = append(args, c.started, c.id)
	}
	b.WriteString(` ORDER BY started_at ` + dir + `, id ` + dir + ` LIMIT ?`)
	args = append(args, limit+1)
	return b.String(), args, limit, order, nil
}

// cursor is the position after the last sandbox of a page.
type cursor struct {
	order   Order
	started int64 // Unix nanoseconds
	id      string
}

// encode returns the token: base64url of "order.started.id".
func (c cursor) encode() string {
	return base64.RawURLEncoding.EncodeToString(
		[]byte(string(c.order) + "." + strconv.FormatInt(c.started, 10) + "." + c.id))
}

// decodeCursor parses a token made by encode; anything else is ErrInvalid.
func decodeCursor(tok string) (cursor, error) {
	bad := fmt.Errorf("%w: malformed next token", ErrInvalid)
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return cursor{}, bad
	}
	parts := strings.Split(string(b), ".")
	if len(parts) != 3 {
		return cursor{}, bad
	}
	c := cursor{order: Order(parts[0]), id: parts[2]}
	if c.order != OrderAsc && c.order != OrderDesc || !ValidSandboxID(c.id) {
		return cursor{}, bad
	}
	if c.started, err = strconv.ParseInt(parts[1], 10, 64); err != nil {
		return cursor{}, bad
	}
	return c, nil
}
