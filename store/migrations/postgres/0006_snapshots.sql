-- PostgreSQL translation of ../0006_snapshots.sql, the same schema.

-- 0006: snapshots (E2B's snapshot templates): a template whose builds are
-- a sandbox's files taken as a layer, not built from steps. snapshot_of is
-- the sandbox its newest snapshot was taken from; NULL for built templates.

ALTER TABLE templates ADD COLUMN snapshot_of TEXT COLLATE "C";
