-- PostgreSQL translation of ../0003_class_rates.sql, the same schema.

-- 0003: per-tenant rate limits of the lifecycle, read and data-plane route
-- classes, beside create_rate / create_burst of 0001. Rates are requests per
-- second, bursts token bucket sizes; NULL: server default.

ALTER TABLE tenants ADD COLUMN lifecycle_rate  DOUBLE PRECISION;
ALTER TABLE tenants ADD COLUMN lifecycle_burst BIGINT;
ALTER TABLE tenants ADD COLUMN read_rate       DOUBLE PRECISION;
ALTER TABLE tenants ADD COLUMN read_burst      BIGINT;
ALTER TABLE tenants ADD COLUMN dataplane_rate  DOUBLE PRECISION;
ALTER TABLE tenants ADD COLUMN dataplane_burst BIGINT;
