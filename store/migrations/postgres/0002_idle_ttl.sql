-- PostgreSQL translation of ../0002_idle_ttl.sql, the same schema.

-- 0002: idle TTL of sandboxes of the native API.
-- idle_ttl is in seconds, NULL (E2B sandboxes) = none; last_active_at is Unix
-- nanoseconds of the last data-plane activity, written by TouchSandbox without
-- bumping generation.

ALTER TABLE sandboxes ADD COLUMN idle_ttl BIGINT;
ALTER TABLE sandboxes ADD COLUMN last_active_at BIGINT;
