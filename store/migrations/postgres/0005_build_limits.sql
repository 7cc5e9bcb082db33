-- PostgreSQL translation of ../0005_build_limits.sql, the same schema.

-- 0005: per-tenant limits of template builds: a build sandbox's CPUs,
-- memory (MiB) and disk (MiB), and a build's time (seconds). NULL: server
-- default.

ALTER TABLE tenants ADD COLUMN build_cpu       BIGINT;
ALTER TABLE tenants ADD COLUMN build_memory_mb BIGINT;
ALTER TABLE tenants ADD COLUMN build_disk_mb   BIGINT;
ALTER TABLE tenants ADD COLUMN build_timeout_s BIGINT;
