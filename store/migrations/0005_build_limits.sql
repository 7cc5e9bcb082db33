-- 0005: per-tenant limits of template builds: a build sandbox's CPUs,
-- memory (MiB) and disk (MiB), and a build's time (seconds). NULL: server
-- default.

ALTER TABLE tenants ADD COLUMN build_cpu       INTEGER;
ALTER TABLE tenants ADD COLUMN build_memory_mb INTEGER;
ALTER TABLE tenants ADD COLUMN build_disk_mb   INTEGER;
ALTER TABLE tenants ADD COLUMN build_timeout_s INTEGER;
