package main

import (
	"context"
	"os/exec"
)

// A scenario whose feature does not exist yet prints "not available" rows,
// never numbers: a claim we cannot measure is not made.

func incusScenario(_ context.Context, b *Bench) error {
	why := "the Incus backend (issue 7) is not implemented yet"
	if _, err := exec.LookPath("incus"); err != nil {
		why += ", and incus is not installed on this machine"
	}
	b.add(
		unavailable("incus", "incus launch --ephemeral vs sandboxd cold create (same image)", why),
		unavailable("incus", "warm claim on the Incus backend", why),
	)
	return nil
}
