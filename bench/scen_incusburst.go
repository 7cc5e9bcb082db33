package main

import (
	"context"
	"fmt"
	"path/filepath"
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
	spare, err := h.waitSpare(ctx, 0, 3*time.Minute)
	if err != nil {
		return err
	}
	lines, _, err := b.runSDKLines(ctx, h, []string{py, filepath.Join(b.cfg.Root, "bench", "sdk_burst.py"), fmt.Sprint(n)}, nil)
	out := b.parseBurst("incus-burst", lines, err)
	total, create, wall, errs, limited := out.total, out.create, out.wall, out.errs, out.limited
	r := dist("incus-burst", label+", each", "ms", total, errs)
	r.Goal = "all done ≤ 2 s"
	r.Compare = fmt.Sprintf("all done in %.0f ms; %d × 429; %d spare members ready at the start", wall, limited, spare)
	c := dist("incus-burst", fmt.Sprintf("Incus: the %d Sandbox.create() calls alone", n), "ms", create, 0)
	b.add(r, c)
	return nil
}
