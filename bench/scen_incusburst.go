package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// incusBurstScenario: issue 24's Incus row. A sandboxd on the Incus
// backend with the default settings (spare pool and create limits as
// shipped; only the lifecycle and read limits off, for the bench's own
// calls) gets n concurrent Sandbox.create() → commands.run('true') from
// E2B's Python SDK, once its spare pool holds its default floor.
func incusBurstScenario(ctx context.Context, b *Bench) error {
	const n = 20
	label := fmt.Sprintf("Incus: %d concurrent Python SDK Sandbox.create() → first commands.run('true'), default settings", n)
	if why := b.incusUnavailable(ctx, newIncusAPI()); why != "" {
		b.add(unavailable("incus-burst", label, why))
		return nil
	}
	py := pythonBin(b.cfg.Root)
	if py == "" {
		b.add(unavailable("incus-burst", label, "compat-tests/python/.venv is missing (scripts/deps.sh installs it)"))
		return nil
	}
	h, err := b.startIncusSide(ctx, "--lifecycle-rate=0", "--read-rate=0")
	if err != nil {
		return err
	}
	defer h.Close()
	// The default floor (on Incus one per GiB available, 2 to 20), as
	// sandboxd reports it, filled.
	var target float64
	for deadline := time.Now().Add(time.Minute); target == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		target, _ = h.metricSum(ctx, "sandboxd_spare_target", map[string]string{"template": "base"})
	}
	spare, err := h.waitSpare(ctx, max(int(target), 1), 3*time.Minute)
	if err != nil {
		return err
	}
	lines, err := b.runSDKLines(ctx, h, []string{py, filepath.Join(b.cfg.Root, "bench", "sdk_burst.py"), fmt.Sprint(n)}, nil)
	var total, create []float64
	var wall float64
	errs, limited := 0, 0
	for _, l := range lines {
		var it struct {
			Kind     string  `json:"kind"`
			CreateMs float64 `json:"create_ms"`
			TotalMs  float64 `json:"total_ms"`
			Ms       float64 `json:"ms"`
			Error    string  `json:"error"`
		}
		if json.Unmarshal(l, &it) != nil {
			continue
		}
		switch it.Kind {
		case "item":
			total, create = append(total, it.TotalMs), append(create, it.CreateMs)
		case "error":
			errs++
			if strings.Contains(it.Error, "429") || strings.Contains(it.Error, "RateLimit") {
				limited++
			}
			b.logf("incus-burst: %s", it.Error)
		case "wall":
			wall = it.Ms
		}
	}
	if err != nil {
		errs++
		b.logf("incus-burst: %v", err)
	}
	r := dist("incus-burst", label+", each", "ms", total, errs)
	r.Goal = "all done ≤ 2 s"
	r.Compare = fmt.Sprintf("all done in %.0f ms; %d × 429; %d spare members ready at the start", wall, limited, spare)
	c := dist("incus-burst", fmt.Sprintf("Incus: the %d Sandbox.create() calls alone", n), "ms", create, 0)
	b.add(r, c)
	return nil
}
