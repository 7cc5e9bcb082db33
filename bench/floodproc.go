package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// floodCounts is what a flood's clients did.
type floodCounts struct {
	OK, Limited, Other, Requests int64
}

// floodClients runs n clients that create on h as key and destroy at once,
// each backing off 50 ms after a 429 or an error, until stop is closed or
// max requests were sent in all.
func floodClients(ctx context.Context, h *Harness, key string, n int, max int64, stop <-chan struct{}) floodCounts {
	var (
		ok, limited, other, req atomic.Int64
		wg                      sync.WaitGroup
	)
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return ctx.Err() != nil
		}
	}
	for range n {
		wg.Go(func() {
			for !stopped() && req.Add(1) <= max {
				sb, err := h.createAs(ctx, key, true)
				switch {
				case err == nil:
					ok.Add(1)
					_ = h.destroyAs(context.WithoutCancel(ctx), key, sb.ID)
				case errors.Is(err, errRateLimited):
					limited.Add(1)
					time.Sleep(50 * time.Millisecond)
				default:
					other.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	return floodCounts{OK: ok.Load(), Limited: limited.Load(), Other: other.Load(), Requests: min(req.Load(), max)}
}

// floodChildEnv names the variable that makes the bench a flood's client
// process (floodProcess).
const floodChildEnv = "BENCH_FLOOD_CHILD"

// floodChildMain is the bench as a flood's client process: its clients run
// until stdin closes, then it prints their counts as JSON.
func floodChildMain() int {
	var args struct {
		Addr, Key string
		Clients   int
		Max       int64
	}
	if err := json.Unmarshal([]byte(os.Getenv(floodChildEnv)), &args); err != nil {
		fmt.Fprintln(os.Stderr, "bench flood child:", err)
		return 2
	}
	h := &Harness{addr: args.Addr, live: map[string]bool{}}
	h.api = newAPIClient()
	stop := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stop) }()
	c := floodClients(context.Background(), h, args.Key, args.Clients, args.Max, stop)
	_ = json.NewEncoder(os.Stdout).Encode(c)
	return 0
}

// floodProcess runs a flood's clients in a process of their own at the
// given nice value, as if on another machine: on a real host a tenant's
// clients do not share the server's CPUs. stop ends it and returns the
// counts.
func floodProcess(h *Harness, key string, clients int, max int64, nice int) (stop func() (floodCounts, error), err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	spec, _ := json.Marshal(map[string]any{"Addr": h.addr, "Key": key, "Clients": clients, "Max": max})
	cmd := nicedCommand(nice, self)
	cmd.Env = append(os.Environ(), floodChildEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return func() (floodCounts, error) {
		in.Close()
		var c floodCounts
		derr := json.NewDecoder(out).Decode(&c)
		if err := cmd.Wait(); err != nil {
			return c, fmt.Errorf("flood process: %w", err)
		}
		return c, derr
	}, nil
}
