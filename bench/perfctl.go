package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// perfWindow is a `perf record --control fifo:CTL,ACK` started with its
// events off (-D -1): the burst scenario turns them on for its creates
// and destroys only, so that sandboxd's own start-up and shutdown (the
// `host` template written to disk, the pools drained) are not counted as
// the creates' CPU. BENCH_PERF_CTL names the two fifos, "CTL,ACK"
// (bench/profile-burst.sh sets it); unset, it does nothing.
type perfWindow struct {
	ctl *os.File
	ack *bufio.Reader
}

func openPerfWindow() (*perfWindow, error) {
	v := os.Getenv("BENCH_PERF_CTL")
	if v == "" {
		return nil, nil
	}
	ctlPath, ackPath, ok := strings.Cut(v, ",")
	if !ok {
		return nil, fmt.Errorf("BENCH_PERF_CTL=%q: want CTL,ACK fifos", v)
	}
	ctl, err := os.OpenFile(ctlPath, os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("perf control fifo: %w", err)
	}
	ack, err := os.Open(ackPath)
	if err != nil {
		ctl.Close()
		return nil, fmt.Errorf("perf ack fifo: %w", err)
	}
	return &perfWindow{ctl: ctl, ack: bufio.NewReader(ack)}, nil
}

// send writes a command and waits for perf's ack, so that the events are
// on before the first create starts (and off only after the last work).
func (w *perfWindow) send(cmd string) error {
	if w == nil {
		return nil
	}
	if _, err := fmt.Fprintln(w.ctl, cmd); err != nil {
		return fmt.Errorf("perf %s: %w", cmd, err)
	}
	if line, err := w.ack.ReadString('\n'); err != nil || strings.TrimSpace(line) != "ack" {
		return fmt.Errorf("perf %s: ack %q, %v", cmd, line, err)
	}
	return nil
}
