package sandbox

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/sandboxd/sandboxd/pool"
	"github.com/sandboxd/sandboxd/runtime/envdconn"
	"github.com/sandboxd/sandboxd/tenant"
)

// UsePool makes creates claim warm members from p first. Call it before
// serving.
func (m *Manager) UsePool(p Pool) { m.adm.UsePool(p) }

// Admission is the Manager's admission control, for the warm pools.
func (m *Manager) Admission() *Admitter { return m.adm }

// PoolKey is the pool a create request of tenant t would claim from: the
// request with every default resolved (template, then its declared
// resources, then the configured defaults). It is the one place defaults
// are applied; the sandbox's row and its runtime.Spec are made from it.
func (m *Manager) PoolKey(t tenant.ID, req CreateRequest) pool.Key {
	tmpl := cmp.Or(req.Template, DefaultTemplate)
	def := m.TemplateResources(tmpl)
	return pool.Key{
		Tenant: t, Template: tmpl,
		CPUCount:      cmpOr(req.CPUCount, def.CPUCount),
		MemoryMB:      cmpOr(req.MemoryMB, def.MemoryMB),
		DiskMB:        cmpOr(req.DiskMB, def.DiskSizeMB),
		AllowInternet: req.AllowInternet,
	}
}

// EnvdHealth asks a sandbox's envd for /health over the backend's channel.
func (m *Manager) EnvdHealth(ctx context.Context, id string) error {
	// Kept: a warm member's checks, then its claim's /init, use one.
	status, msg, err := m.envdAsk(ctx, id, http.MethodGet, "/health", nil, true)
	if err != nil {
		return err
	}
	return envdconn.Answered("/health", status, msg)
}

// MemAvailableMB reads MemAvailable from /proc/meminfo, in MiB.
func MemAvailableMB() (int, error) { return meminfoMB("MemAvailable") }

// MemTotalMB reads MemTotal from /proc/meminfo, in MiB.
func MemTotalMB() (int, error) { return meminfoMB("MemTotal") }

// memTotalEvery is how long a read of MemTotal stands for the admission
// check every create makes (checkFits): reading /proc/meminfo was a tenth
// of a warm claim's CPU, and MemTotal moves only with memory hotplug or a
// balloon.
const memTotalEvery = time.Second

// memAvailableEvery is how long a read of MemAvailable stands for the
// host guard (checkHost), which a cold create passes twice, before its
// wait for a slot and after: each read of /proc/meminfo cost 50-60 µs of
// CPU on a 2-CPU host, and MemAvailable follows the sandboxes' real use,
// which a create adds to only once it runs, well after 10 ms.
const memAvailableEvery = 10 * time.Millisecond

// cachedMB returns read, read again at most once every ttl. A failed read
// is not kept: the next call tries again.
func cachedMB(ttl time.Duration, read func() (int, error)) func() (int, error) {
	var (
		mu sync.Mutex
		at time.Time
		mb int
	)
	return func() (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if !at.IsZero() && time.Since(at) < ttl {
			return mb, nil
		}
		v, err := read()
		if err != nil {
			return 0, err
		}
		mb, at = v, time.Now()
		return mb, nil
	}
}

func meminfoMB(field string) (int, error) {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	return parseMeminfo(raw, field)
}

func parseMeminfo(raw []byte, field string) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) >= 2 && string(f[0]) == field+":" {
			kb, err := strconv.Atoi(string(f[1]))
			if err != nil {
				return 0, fmt.Errorf("meminfo: %w", err)
			}
			return kb / 1024, nil
		}
	}
	return 0, fmt.Errorf("meminfo: no %s", field)
}

// NewID mints a sandbox id (for warm pool members, whose id becomes the
// sandbox's on claim).
func NewID() string { return newID() }

// NewToken mints an envd access token.
func NewToken() string { return newToken() }
