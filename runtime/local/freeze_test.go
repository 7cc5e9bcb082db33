package local

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/opencontainers/runc/libcontainer"
)

func TestRetryFreeze(t *testing.T) {
	stuck := errors.New("unable to freeze")
	waits := []time.Duration{time.Millisecond, time.Millisecond, time.Millisecond}
	for _, tc := range []struct {
		name      string
		fails     int   // calls that fail before one succeeds
		failWith  error // what they fail with
		running   bool
		canceled  bool
		wantCalls int
		wantErr   error
	}{
		{name: "first try", fails: 0, running: true, wantCalls: 1},
		{name: "third try", fails: 2, failWith: stuck, running: true, wantCalls: 3},
		{name: "never", fails: 99, failWith: stuck, running: true, wantCalls: 4, wantErr: stuck},
		{name: "not running", fails: 99, failWith: libcontainer.ErrNotRunning, running: true, wantCalls: 1, wantErr: libcontainer.ErrNotRunning},
		{name: "stopped meanwhile", fails: 99, failWith: stuck, running: false, wantCalls: 1, wantErr: stuck},
		{name: "context ends", fails: 99, failWith: stuck, running: true, canceled: true, wantCalls: 1, wantErr: context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			waits := waits
			if tc.canceled {
				cancel()
				waits = []time.Duration{time.Hour} // only the context can end the wait
			}
			calls := 0
			err := retryFreeze(ctx, func() error {
				calls++
				if calls <= tc.fails {
					return tc.failWith
				}
				return nil
			}, func() bool { return tc.running }, waits)
			if calls != tc.wantCalls {
				t.Errorf("pause called %d times, want %d", calls, tc.wantCalls)
			}
			switch {
			case tc.wantErr == nil && err != nil:
				t.Errorf("err = %v, want nil", err)
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
		})
	}
}
