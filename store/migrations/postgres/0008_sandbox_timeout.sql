-- PostgreSQL translation of ../0008_sandbox_timeout.sql, the same schema.

-- 0008: a sandbox's own timeout, in milliseconds: what its create (or fork)
-- asked for, after the server's clamp. An auto-resume gives the sandbox this
-- timeout afresh, as E2B does. It is set once: a set_timeout or refresh moves
-- end_at only. NULL on rows from before this migration: the server's default
-- timeout applies to them.

ALTER TABLE sandboxes ADD COLUMN timeout_ms BIGINT;
