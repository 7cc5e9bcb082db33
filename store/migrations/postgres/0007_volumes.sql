-- PostgreSQL translation of ../0007_volumes.sql, the same schema.

-- 0007: E2B volumes: persistent directories a tenant mounts into its
-- sandboxes (the backend keeps the files; this is the record). A volume's
-- name is unique within its tenant. The token authenticates the volume
-- content API and is returned to the owner by GET /volumes/{id}, so it is
-- kept as is. size_mb is the size the backend made it with.
--
-- Per-tenant volume settings (NULL: server default): how many volumes, their
-- total size (MiB), and the size of a new volume (MiB).

CREATE TABLE volumes (
	id         TEXT COLLATE "C" PRIMARY KEY,
	tenant_id  TEXT COLLATE "C" NOT NULL REFERENCES tenants (id),
	name       TEXT COLLATE "C" NOT NULL,
	token      TEXT COLLATE "C" NOT NULL,
	size_mb    BIGINT  NOT NULL,
	created_at BIGINT  NOT NULL,
	UNIQUE (tenant_id, name)
);

-- The volumes a sandbox mounts, as its create named them (what GET
-- /sandboxes/{id} reports); they go with the sandbox's row.
CREATE TABLE sandbox_volumes (
	sandbox_id TEXT COLLATE "C" NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	volume_id  TEXT COLLATE "C" NOT NULL,
	name       TEXT COLLATE "C" NOT NULL,
	path       TEXT COLLATE "C" NOT NULL,
	PRIMARY KEY (sandbox_id, path)
);

ALTER TABLE tenants ADD COLUMN max_volumes    BIGINT;
ALTER TABLE tenants ADD COLUMN max_volumes_mb BIGINT;
ALTER TABLE tenants ADD COLUMN volume_size_mb BIGINT;
