-- 0001: tenants, hashed API keys, sandboxes.
-- Times are INTEGER Unix nanoseconds (UTC); booleans are INTEGER 0/1;
-- JSON columns hold TEXT produced by encoding/json.

CREATE TABLE tenants (
	id            TEXT    PRIMARY KEY,          -- the tenant's name, immutable
	min_warm      INTEGER,                      -- NULL: server default
	create_rate   REAL,                         -- creates per second; NULL: server default
	create_burst  INTEGER,                      -- NULL: server default
	max_sandboxes INTEGER,                      -- NULL: server default
	max_memory_mb INTEGER,                      -- NULL: server default
	created_at    INTEGER NOT NULL,
	updated_at    INTEGER NOT NULL
) STRICT;

CREATE TABLE api_keys (
	id         TEXT    PRIMARY KEY,
	tenant_id  TEXT    NOT NULL REFERENCES tenants (id),
	hash       BLOB    NOT NULL UNIQUE,         -- SHA-256 of the plaintext key
	prefix     TEXT    NOT NULL,                -- non-secret display prefix, e.g. e2b_1a2b3c
	created_at INTEGER NOT NULL,
	revoked_at INTEGER                          -- NULL while the key is live
) STRICT;

CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

CREATE TABLE sandboxes (
	id                    TEXT    PRIMARY KEY,
	tenant_id             TEXT    NOT NULL REFERENCES tenants (id),
	template              TEXT    NOT NULL,
	alias                 TEXT    NOT NULL,
	state                 TEXT    NOT NULL,
	started_at            INTEGER NOT NULL,
	end_at                INTEGER NOT NULL,
	cpu_count             INTEGER NOT NULL,
	memory_mb             INTEGER NOT NULL,
	disk_mb               INTEGER NOT NULL,
	metadata              TEXT    NOT NULL,     -- JSON object of strings
	env_vars              TEXT    NOT NULL,     -- JSON object of strings
	envd_access_token     TEXT    NOT NULL,
	secure                INTEGER NOT NULL,
	allow_internet_access INTEGER NOT NULL,
	network               TEXT,                 -- JSON, opaque to the store; NULL if unset
	on_timeout            TEXT    NOT NULL,     -- kill | pause
	auto_resume           INTEGER NOT NULL,
	backend               TEXT    NOT NULL,
	handle                TEXT    NOT NULL,     -- backend's opaque handle
	generation            INTEGER NOT NULL,     -- bumped by every update
	created_at            INTEGER NOT NULL,
	updated_at            INTEGER NOT NULL
) STRICT;

-- Listing a tenant's sandboxes in start order (keyset paging on started_at, id).
CREATE INDEX sandboxes_tenant_started ON sandboxes (tenant_id, started_at, id);
-- The sweeper's expiry scan and the live scans.
CREATE INDEX sandboxes_state_end ON sandboxes (state, end_at);
