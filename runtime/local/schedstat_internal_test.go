package local

import (
	"os"
	goruntime "runtime"
	"testing"
	"time"
)

func TestParseSchedstat(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    taskTimes
		wantErr bool
	}{
		{in: "4096000 1500000 12\n", want: taskTimes{4096 * time.Microsecond, 1500 * time.Microsecond}},
		{in: "0 0 0", want: taskTimes{}},
		{in: "7 8", want: taskTimes{7, 8}},
		{in: "", wantErr: true},
		{in: "12\n", wantErr: true},
		{in: "x 1 2", wantErr: true},
		{in: "1 -y 2", wantErr: true},
	} {
		got, err := parseSchedstat(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("parseSchedstat(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

// A spinning thread is on a CPU or waiting for one the whole time, however
// busy the box, and a process's times are at least those of a thread of it.
func TestThreadTimes(t *testing.T) {
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	before, err := threadTimes()
	if err != nil {
		t.Skipf("no schedstat here: %v", err)
	}
	for end := time.Now().Add(20 * time.Millisecond); time.Now().Before(end); {
	}
	after, err := threadTimes()
	if err != nil {
		t.Fatal(err)
	}
	if d := after.sub(before); d.onCPU <= 0 || d.onCPU+d.runqueue < 10*time.Millisecond {
		t.Errorf("over 20 ms of spinning: on a CPU %v, waiting for one %v; want more than 0 and 10 ms in all", d.onCPU, d.runqueue)
	}
	proc, err := processTimes(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if proc.onCPU < after.onCPU {
		t.Errorf("process on a CPU %v, less than one of its threads (%v)", proc.onCPU, after.onCPU)
	}
	if _, err := processTimes(-1); err == nil {
		t.Error("processTimes(-1): no error")
	}
}
