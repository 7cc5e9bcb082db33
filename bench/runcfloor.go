package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// runcFloor runs /bin/true with `runc run`, built by bench/run.sh from the
// runc release whose libcontainer the local backend links. It is the floor
// of the backend's design: the same library making the same namespaces
// (mount, pid, uts, ipc, net, cgroup), a cgroup and a read-only root with
// the host's /usr, /bin, /lib* bound in, then starting one process. What a
// sandbox adds to it is envd's start, the overlay on a tmpfs, the seccomp
// profile and the API; what it saves is runc's own start as a process.
type runcFloor struct {
	bin, bundle, root string
	n                 int
}

const runcFloorMeasure = "runc run /bin/true (libcontainer as the local backend links it; namespaces, cgroup, read-only root)"

func newRuncFloor(binDir string) (*runcFloor, error) {
	bin := filepath.Join(binDir, "runc")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s: %w (bench/run.sh builds it)", bin, err)
	}
	dir, err := os.MkdirTemp("", "sandboxd-bench-runc-")
	if err != nil {
		return nil, err
	}
	f := &runcFloor{bin: bin, bundle: filepath.Join(dir, "bundle"), root: filepath.Join(dir, "state")}
	if err := f.writeBundle(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return f, nil
}

func (f *runcFloor) writeBundle() error {
	if err := os.MkdirAll(filepath.Join(f.bundle, "rootfs"), 0o755); err != nil {
		return err
	}
	// runc's own default spec, so the namespaces and masks are runc's.
	if out, err := exec.Command(f.bin, "spec", "--bundle", f.bundle).CombinedOutput(); err != nil {
		return fmt.Errorf("runc spec: %w: %s", err, out)
	}
	p := filepath.Join(f.bundle, "config.json")
	raw, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return err
	}
	proc, _ := spec["process"].(map[string]any)
	if proc == nil {
		return errors.New("runc spec: no process")
	}
	proc["terminal"] = false
	proc["args"] = []string{"/bin/true"}
	spec["root"] = map[string]any{"path": "rootfs", "readonly": true}
	mounts, _ := spec["mounts"].([]any)
	for _, d := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib64"} {
		if _, err := os.Stat(d); err != nil {
			continue
		}
		if err := os.MkdirAll(filepath.Join(f.bundle, "rootfs", d), 0o755); err != nil {
			return err
		}
		mounts = append(mounts, map[string]any{"destination": d, "type": "bind", "source": d, "options": []string{"rbind", "ro"}})
	}
	spec["mounts"] = mounts
	raw, err = json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(p, raw, 0o644)
}

// run is one `runc run`: create, start, wait for /bin/true, delete.
func (f *runcFloor) run() (time.Duration, error) {
	f.n++
	id := fmt.Sprintf("floor-%d-%d", os.Getpid(), f.n)
	cmd := exec.Command(f.bin, "--root", f.root, "run", "--bundle", f.bundle, id)
	t0 := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(t0)
	if err != nil {
		_ = exec.Command(f.bin, "--root", f.root, "delete", "--force", id).Run()
		return 0, fmt.Errorf("runc run: %w: %s", err, out)
	}
	return d, nil
}

func (f *runcFloor) Close() {
	_ = os.RemoveAll(filepath.Dir(f.bundle))
}
