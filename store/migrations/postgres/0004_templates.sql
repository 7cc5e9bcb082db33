-- PostgreSQL translation of ../0004_templates.sql, the same schema.

-- 0004: templates built through E2B's template API (build system v2), their
-- builds and tags. A template belongs to one tenant; its name is unique
-- within the tenant. A build's result (layers and config) is JSON opaque to
-- the store, written once when the build is ready.

CREATE TABLE templates (
	id         TEXT COLLATE "C" PRIMARY KEY,        -- E2B's templateID
	tenant_id  TEXT COLLATE "C" NOT NULL REFERENCES tenants (id),
	name       TEXT COLLATE "C" NOT NULL,
	public     BIGINT  NOT NULL,
	cpu_count  BIGINT  NOT NULL,                    -- 0: server default
	memory_mb  BIGINT  NOT NULL,                    -- 0: server default
	created_at BIGINT  NOT NULL,
	updated_at BIGINT  NOT NULL,
	UNIQUE (tenant_id, name)
);

CREATE TABLE template_builds (
	id          TEXT COLLATE "C" PRIMARY KEY,       -- E2B's buildID (a UUID)
	template_id TEXT COLLATE "C" NOT NULL REFERENCES templates (id) ON DELETE CASCADE,
	status      TEXT COLLATE "C" NOT NULL,          -- waiting | building | ready | error
	reason      TEXT COLLATE "C" NOT NULL,          -- why it failed; "" otherwise
	reason_step TEXT COLLATE "C" NOT NULL,
	result      TEXT COLLATE "C",                   -- JSON, set when ready
	logs        TEXT COLLATE "C" NOT NULL,          -- JSON array of log entries, set when finished
	created_at  BIGINT  NOT NULL,
	updated_at  BIGINT  NOT NULL
);

CREATE INDEX template_builds_template ON template_builds (template_id, created_at);

CREATE TABLE template_tags (
	template_id TEXT COLLATE "C" NOT NULL REFERENCES templates (id) ON DELETE CASCADE,
	tag         TEXT COLLATE "C" NOT NULL,
	build_id    TEXT COLLATE "C" NOT NULL REFERENCES template_builds (id) ON DELETE CASCADE,
	created_at  BIGINT  NOT NULL,
	PRIMARY KEY (template_id, tag)
);
