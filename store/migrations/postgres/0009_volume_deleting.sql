-- PostgreSQL translation of ../0009_volume_deleting.sql, the same schema.

-- 0009: a volume being deleted. Delete marks its record (Unix nanoseconds),
-- then removes the backend's files, then the record: a marked record is
-- neither listed nor found, and a crash anywhere in between leaves one
-- that the next start's Prune finishes deleting. NULL: not being deleted.

ALTER TABLE volumes ADD COLUMN deleting_at BIGINT;
