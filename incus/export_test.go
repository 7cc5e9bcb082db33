package incus

import "context"

// OwnerOf is b's mark on the layer images it makes, for the tests.
func OwnerOf(b *Backend) string { return b.owner }

// QuotaGuard exposes b's quota guard to the tests.
type QuotaGuard struct{ g *quotaGuard }

func QuotaGuardOf(b *Backend) QuotaGuard { return QuotaGuard{b.quota} }

// Inconsistent is the sysfs file the guard reads ("" when none).
func (q QuotaGuard) Inconsistent() string { return q.g.inconsistent }

// Check is quotaGuard.check.
func (q QuotaGuard) Check(ctx context.Context) (bool, error) { return q.g.check(ctx) }

// Simple says whether the guard found simple quotas on the pool.
func (q QuotaGuard) Simple() bool { return q.g.simple }

// PoolSimpleQuotas says whether this host's Incus pool keeps simple quotas.
func PoolSimpleQuotas(pool string) bool {
	return newQuotaGuard("/var/lib/incus/storage-pools/" + pool).simple
}
