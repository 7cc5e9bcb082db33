package procstat

import "testing"

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		want       CPU
		busy, all  uint64
		wantErr    bool
	}{
		{name: "current kernel", line: "cpu  100 2 30 400 5 6 7 8 900 90",
			want: CPU{User: 100, Nice: 2, System: 30, Idle: 400, IOWait: 5, IRQ: 6, SoftIRQ: 7, Steal: 8}, busy: 153, all: 558},
		{name: "no steal field", line: "cpu 1 2 3 4 5 6 7",
			want: CPU{User: 1, Nice: 2, System: 3, Idle: 4, IOWait: 5, IRQ: 6, SoftIRQ: 7}, busy: 19, all: 28},
		{name: "a single CPU's line", line: "cpu0 1 2 3 4 5 6 7 8", wantErr: true},
		{name: "empty", line: "", wantErr: true},
		{name: "not a number", line: "cpu 1 x 3 4 5", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.line)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Parse(%q) error %v; want error %v", tc.line, err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if got != tc.want || got.Busy() != tc.busy || got.All() != tc.all {
				t.Errorf("Parse(%q) = %+v (busy %d, all %d); want %+v (busy %d, all %d)", tc.line, got, got.Busy(), got.All(), tc.want, tc.busy, tc.all)
			}
		})
	}
}

func TestRead(t *testing.T) {
	c, err := Read()
	if err != nil {
		t.Skipf("no /proc/stat here: %v", err)
	}
	if c.All() == 0 {
		t.Errorf("Read() = %+v: no time at all since boot", c)
	}
}
