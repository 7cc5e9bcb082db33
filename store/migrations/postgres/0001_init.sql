-- PostgreSQL translation of ../0001_init.sql, the same schema: BIGINT for
-- INTEGER (PostgreSQL's INTEGER is 32-bit; these hold Unix nanoseconds),
-- DOUBLE PRECISION for REAL (PostgreSQL's REAL is 32-bit), BYTEA for BLOB,
-- no STRICT (PostgreSQL's columns are always typed), and TEXT COLLATE "C":
-- SQLite orders text bytewise, and so must the listings by id and name and
-- their keyset pages, whatever the database's default collation.

-- 0001: tenants, hashed API keys, sandboxes.
-- Times are BIGINT Unix nanoseconds (UTC); booleans are BIGINT 0/1;
-- JSON columns hold TEXT produced by encoding/json.

CREATE TABLE tenants (
	id            TEXT COLLATE "C" PRIMARY KEY, -- the tenant's name, immutable
	min_warm      BIGINT,                       -- NULL: server default
	create_rate   DOUBLE PRECISION,             -- creates per second; NULL: server default
	create_burst  BIGINT,                       -- NULL: server default
	max_sandboxes BIGINT,                       -- NULL: server default
	max_memory_mb BIGINT,                       -- NULL: server default
	created_at    BIGINT  NOT NULL,
	updated_at    BIGINT  NOT NULL
);

CREATE TABLE api_keys (
	id         TEXT COLLATE "C" PRIMARY KEY,
	tenant_id  TEXT COLLATE "C" NOT NULL REFERENCES tenants (id),
	hash       BYTEA   NOT NULL UNIQUE,         -- SHA-256 of the plaintext key
	prefix     TEXT COLLATE "C" NOT NULL,       -- non-secret display prefix, e.g. e2b_1a2b3c
	created_at BIGINT  NOT NULL,
	revoked_at BIGINT                           -- NULL while the key is live
);

CREATE INDEX api_keys_tenant ON api_keys (tenant_id);

CREATE TABLE sandboxes (
	id                    TEXT COLLATE "C" PRIMARY KEY,
	tenant_id             TEXT COLLATE "C" NOT NULL REFERENCES tenants (id),
	template              TEXT COLLATE "C" NOT NULL,
	alias                 TEXT COLLATE "C" NOT NULL,
	state                 TEXT COLLATE "C" NOT NULL,
	started_at            BIGINT  NOT NULL,
	end_at                BIGINT  NOT NULL,
	cpu_count             BIGINT  NOT NULL,
	memory_mb             BIGINT  NOT NULL,
	disk_mb               BIGINT  NOT NULL,
	metadata              TEXT COLLATE "C" NOT NULL, -- JSON object of strings
	env_vars              TEXT COLLATE "C" NOT NULL, -- JSON object of strings
	envd_access_token     TEXT COLLATE "C" NOT NULL,
	secure                BIGINT  NOT NULL,
	allow_internet_access BIGINT  NOT NULL,
	network               TEXT COLLATE "C",     -- JSON, opaque to the store; NULL if unset
	on_timeout            TEXT COLLATE "C" NOT NULL, -- kill | pause
	auto_resume           BIGINT  NOT NULL,
	backend               TEXT COLLATE "C" NOT NULL,
	handle                TEXT COLLATE "C" NOT NULL, -- backend's opaque handle
	generation            BIGINT  NOT NULL,     -- bumped by every update
	created_at            BIGINT  NOT NULL,
	updated_at            BIGINT  NOT NULL
);

-- Listing a tenant's sandboxes in start order (keyset paging on started_at, id).
CREATE INDEX sandboxes_tenant_started ON sandboxes (tenant_id, started_at, id);
-- The sweeper's expiry scan and the live scans.
CREATE INDEX sandboxes_state_end ON sandboxes (state, end_at);
