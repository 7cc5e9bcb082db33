package process

import (
	"context"
	"fmt"
	"net/http"
	"time"

	rpc "github.com/sandboxd/sandboxd/envd/api/process"
	"github.com/sandboxd/sandboxd/envd/internal/keepalive"
	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// stream sends p's events to one reader: start first (E2B's SDKs reject a
// stream that opens with anything else), then data as it arrives, with a
// keepalive whenever the stream has been idle for the client's interval,
// then the end event. sub is nil when p had already ended; the reader then
// gets start and end only. Leaving early (ctx ends) detaches the reader and
// leaves the process alone; for the starting client's (blocking) sub that
// also lets the process's output run on unthrottled.
func (s *Service) stream(ctx context.Context, h http.Header, p *process, sub *subscription[*rpc.ProcessEvent], send func(*rpc.ProcessEvent) error) error {
	if sub != nil {
		defer sub.cancel()
	}
	if err := send(&rpc.ProcessEvent{Event: &rpc.ProcessEvent_Start{Start: &rpc.ProcessEvent_StartEvent{Pid: p.pid}}}); err != nil {
		return rpcerr.Connect(err)
	}
	if sub == nil {
		return rpcerr.Connect(send(endOf(p)))
	}

	interval := keepalive.Interval(h)
	deadline, _ := ctx.Deadline() // zero: none
	idle := time.NewTimer(interval)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return rpcerr.Connect(ctx.Err())
		case <-idle.C:
			if err := send(&rpc.ProcessEvent{Event: &rpc.ProcessEvent_Keepalive{Keepalive: &rpc.ProcessEvent_KeepAlive{}}}); err != nil {
				return rpcerr.Connect(err)
			}
			idle.Reset(interval)
		case ev, ok := <-sub.C():
			// Connect-Timeout-Ms is both the RPC's deadline and the
			// process's lifetime, so a timed-out process's end event races
			// the deadline here. The deadline wins: the SDKs turn
			// deadline_exceeded into their timeout error, and an end event
			// would read as the command failing by SIGKILL instead.
			if err := expired(ctx, deadline); err != nil {
				return rpcerr.Connect(err)
			}
			if !ok {
				if err := sub.Err(); err != nil {
					s.log.Warn("process reader disconnected", "pid", p.pid, "err", err)
					return rpcerr.Connect(fmt.Errorf("process %d: %w", p.pid, err))
				}
				// The fanout ended without the end event: the starting
				// client's buffer was full when the process ended (nothing
				// was lost; the end is only not buffered). Never end a
				// stream without it.
				return rpcerr.Connect(send(endOf(p)))
			}
			if err := send(ev); err != nil {
				return rpcerr.Connect(err)
			}
			if ev.GetEnd() != nil {
				return nil
			}
			idle.Reset(interval)
		}
	}
}

// expired is ctx's error, or DeadlineExceeded once ctx's deadline (zero
// when it has none) has passed even if its timer has not fired yet: the
// process's lifetime starts after the RPC's deadline was set, so by the time
// a timed-out process's end event arrives the deadline has passed, whichever
// goroutine ran first.
func expired(ctx context.Context, deadline time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// endOf is the end event of a process that has ended.
func endOf(p *process) *rpc.ProcessEvent {
	<-p.done // immediate: done closes before the fanout ends
	return &rpc.ProcessEvent{Event: &rpc.ProcessEvent_End{End: p.end}}
}
