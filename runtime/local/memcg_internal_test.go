package local

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/opencontainers/cgroups"
)

// TestMemcgSpares: the parked memory cgroups' bookkeeping on the kernel's
// own v1 memory hierarchy, without sandboxes: park keeps at most max and
// refuses a cgroup with a process in it or more than memcgSpareMaxCharge
// charged; take hands out each parked cgroup once and keeps it when the
// target exists; a new instance adopts what fits of what an earlier one
// parked, removes the rest and numbers on; close removes them all.
func TestMemcgSpares(t *testing.T) {
	root := "/sys/fs/cgroup/memory"
	if cgroups.IsCgroup2UnifiedMode() || !exists(filepath.Join(root, "memory.limit_in_bytes")) {
		t.Skip("no cgroup v1 memory hierarchy")
	}
	parent := filepath.Join(root, fmt.Sprintf("sandboxd-test-memcg-%d", os.Getpid()))
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ents, _ := os.ReadDir(parent)
		for _, e := range ents {
			if e.IsDir() {
				_ = os.Remove(filepath.Join(parent, e.Name()))
			}
		}
		if err := os.Remove(parent); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	mk := func(name string) string {
		t.Helper()
		p := filepath.Join(parent, name)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	parked := func() []string {
		t.Helper()
		m, err := filepath.Glob(filepath.Join(parent, memcgSpareName+"*"))
		if err != nil {
			t.Fatal(err)
		}
		for i := range m {
			m[i] = filepath.Base(m[i])
		}
		slices.Sort(m)
		return m
	}
	// join starts a shell in cgroup dir that runs script once told to,
	// and returns the first line it writes and the shell, to wait for.
	join := func(dir, script string) (string, *exec.Cmd) {
		t.Helper()
		cmd := exec.Command("sh", "-c", "read go; "+script)
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if err := cgroups.WriteCgroupProc(dir, cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(in, "go\n"); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			t.Fatalf("the shell in %s: %v", dir, err)
		}
		return line, cmd
	}

	m := &memcgSpares{parent: parent, max: 2}
	a, b, c := mk("a"), mk("b"), mk("c")
	if !m.park(a) || !m.park(b) {
		t.Fatal("park of an empty cgroup refused with room for it")
	}
	if m.park(c) {
		t.Error("park with max parked already: kept")
	}
	if got, want := parked(), []string{memcgSpareName + "0", memcgSpareName + "1"}; !slices.Equal(got, want) {
		t.Errorf("parked %q; want %q", got, want)
	}
	if exists(a) || exists(b) || !exists(c) {
		t.Errorf("after the parks a %v, b %v, c %v; want only c left", exists(a), exists(b), exists(c))
	}
	if m.park(filepath.Join(root, "elsewhere")) {
		t.Error("park of a cgroup outside the parent: kept")
	}

	// The target exists: the parked cgroup stays parked.
	if m.take(c) {
		t.Error("take to an existing cgroup: taken")
	}
	x, y, z := filepath.Join(parent, "x"), filepath.Join(parent, "y"), filepath.Join(parent, "z")
	if !m.take(x) || !m.take(y) {
		t.Fatal("take with two parked: none")
	}
	if m.take(z) || exists(z) {
		t.Error("take with none parked: taken")
	}
	if !exists(x) || !exists(y) || len(parked()) != 0 {
		t.Errorf("after the takes x %v, y %v, parked %q", exists(x), exists(y), parked())
	}

	// A process in the cgroup: refused (a rename would move it along).
	if line, _ := join(c, "echo in; exec sleep 60"); line != "in\n" {
		t.Fatalf("the shell said %q", line)
	}
	if m.park(c) || !exists(c) {
		t.Error("park of a cgroup with a process in it: kept")
	}
	// More than memcgSpareMaxCharge charged (page cache written from in
	// it stays charged to it once the writer has gone): refused.
	big := filepath.Join(t.TempDir(), "big")
	mb := memcgSpareMaxCharge>>20 + 8
	line, sh := join(x, fmt.Sprintf("dd if=/dev/zero of=%s bs=1M count=%d 2>/dev/null; echo $?", big, mb))
	if line != "0\n" {
		t.Fatalf("dd in x: exit %q", line)
	}
	if err := sh.Wait(); err != nil {
		t.Fatal(err)
	}
	if procs, err := os.ReadFile(filepath.Join(x, "cgroup.procs")); err != nil || len(procs) != 0 {
		t.Fatalf("x's processes after the shell's exit: %q, %v; want none", procs, err)
	}
	if err := parkable(x); err == nil {
		t.Fatal("a cgroup left charged with the file written in it: parkable")
	}
	if m.park(x) || !exists(x) {
		t.Errorf("park of a cgroup with %d MiB charged: kept", mb)
	}
	if err := os.Remove(big); err != nil {
		t.Fatal(err)
	}

	// An earlier instance's parked cgroups: the next adopts what fits
	// (max 1), removes the rest and numbers on past the highest.
	if !m.park(y) || !m.park(mk("w")) {
		t.Fatal("park refused with room")
	}
	earlier := parked()
	if len(earlier) != 2 {
		t.Fatalf("parked %q; want two", earlier)
	}
	n := &memcgSpares{parent: parent, max: 1}
	if !n.take(filepath.Join(parent, "v")) {
		t.Fatal("take by a new instance: none of the earlier one's parked")
	}
	if got := parked(); len(got) != 0 {
		t.Errorf("after the new instance's adoption and take, parked %q; want none (one taken, one removed)", got)
	}
	if !n.park(filepath.Join(parent, "v")) {
		t.Fatal("park refused with room")
	}
	number := func(name string) int {
		t.Helper()
		n, err := strconv.Atoi(name[len(memcgSpareName):])
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := parked(); len(got) != 1 || number(got[0]) <= max(number(earlier[0]), number(earlier[1])) {
		t.Errorf("parked %q; want one numbered past the earlier instance's %q", got, earlier)
	}
	n.close()
	if got := parked(); len(got) != 0 {
		t.Errorf("close left %q", got)
	}
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
