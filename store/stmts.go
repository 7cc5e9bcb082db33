package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// The store's queries on every request's path, prepared once at Open: the
// database (SQLite, or PostgreSQL's server) then parses each once per
// connection instead of at every call. The
// writer's are prepared before any transaction can hold its one connection
// (preparing on that pool inside a transaction would wait for it forever).
var (
	lookupKeySQL     = `SELECT tenant_id, hash FROM api_keys WHERE hash = ? AND revoked_at IS NULL`
	getSandboxSQL    = `SELECT ` + sandboxCols + ` FROM sandboxes WHERE id = ? AND tenant_id = ?`
	getSandboxAnySQL = `SELECT ` + sandboxCols + ` FROM sandboxes WHERE id = ?`
	tenantExistsSQL  = `SELECT 1 FROM tenants WHERE id = ?`
	insertSandboxSQL = `INSERT INTO sandboxes (` + sandboxCols + `) VALUES (` + placeholders(26) + `)`
	// last_active_at only moves forwards: a TouchSandbox since the row was
	// read (it does not bump generation) is kept.
	updateSandboxSQL = `UPDATE sandboxes SET ` + mutableSet + `, idle_ttl = ?,
		last_active_at = ` + laterOf("last_active_at") + `,
		generation = generation + 1, updated_at = ?
		WHERE id = ? AND tenant_id = ? AND generation = ?`
)

// stmts holds the prepared statements; run those of the writer inside its
// transactions with tx.StmtContext.
type stmts struct {
	lookupKey, getSandbox, getSandboxAny       *sql.Stmt // on the readers
	tenantExists, insertSandbox, updateSandbox *sql.Stmt // on the writer
}

func prepareStmts(ctx context.Context, w, r *sql.DB) (*stmts, error) {
	var (
		p    stmts
		errs []error
	)
	prep := func(db *sql.DB, dst **sql.Stmt, query string) {
		st, err := db.PrepareContext(ctx, query)
		*dst = st
		errs = append(errs, err)
	}
	prep(r, &p.lookupKey, lookupKeySQL)
	prep(r, &p.getSandbox, getSandboxSQL)
	prep(r, &p.getSandboxAny, getSandboxAnySQL)
	prep(w, &p.tenantExists, tenantExistsSQL)
	prep(w, &p.insertSandbox, insertSandboxSQL)
	prep(w, &p.updateSandbox, updateSandboxSQL)
	if err := errors.Join(errs...); err != nil {
		p.close()
		return nil, fmt.Errorf("prepare: %w", err)
	}
	return &p, nil
}

// close closes the statements that were prepared.
func (p *stmts) close() {
	for _, st := range []*sql.Stmt{p.lookupKey, p.getSandbox, p.getSandboxAny, p.tenantExists, p.insertSandbox, p.updateSandbox} {
		if st != nil {
			_ = st.Close()
		}
	}
}
