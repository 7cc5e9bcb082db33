-- PostgreSQL translation of ../0010_layer_removals.sql, the same schema.

-- 0010: layers to remove from the backend. A template's delete records
-- the layers of its builds here in the transaction that deletes them, and
-- a failed snapshot its own; the template service removes each layer once
-- no ready build and no live sandbox uses it, and its row with it. Neither
-- a sandbox that still uses a layer (its removal waits) nor a crash of
-- sandboxd forgets one. queued_at: Unix nanoseconds.

CREATE TABLE layer_removals (
	layer     TEXT COLLATE "C" PRIMARY KEY,
	queued_at BIGINT NOT NULL
);
