package egress

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// nftSession is one long-lived `nft -i` that the per-sandbox policies go
// through. A fresh nft process for each change spends 10-20 ms (measured
// on this project's 2-core box with a dozen tables) building its cache of
// the host's whole ruleset before it sends anything; the kernel's commit
// of a policy is about 1 ms. The session keeps its cache between
// commands. Each script goes in as one line, so it is still one
// transaction; a marker command that must fail (listing a table that
// cannot exist) follows it, and its error message, which names the
// marker, tells where the script's output ends.
type nftSession struct {
	mu   sync.Mutex
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	raw  *os.File
	n    uint64
	last string // the output of the last exchange
}

// maxSessionLine bounds a script sent through the session; a longer one
// (hundreds of rules with ports) goes through a fresh nft.
const maxSessionLine = 64 << 10

// run applies script (one nft command a line) as one transaction.
func (s *nftSession) run(script string) error {
	var cmds []string
	for _, l := range strings.Split(script, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			cmds = append(cmds, l)
		}
	}
	line := strings.Join(cmds, "; ")
	if len(line) > maxSessionLine {
		return runNftExec(script)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		if err := s.start(); err != nil {
			return runNftExec(script) // no session: the slow way
		}
	}
	err := s.exchange(line)
	var broken sessionError
	if errors.As(err, &broken) {
		s.stop()
		return runNftExec(script) // the session died: the slow way
	}
	return err
}

// sessionError: the session itself failed (not the script).
type sessionError struct{ error }

func (s *nftSession) exchange(line string) error {
	s.n++
	marker := fmt.Sprintf("sbxsync%d_%d", os.Getpid(), s.n)
	if _, err := io.WriteString(s.in, line+"\nlist table inet "+marker+"\n"); err != nil {
		return sessionError{err}
	}
	_ = s.raw.SetReadDeadline(time.Now().Add(30 * time.Second))
	var lines []string
	for {
		l, err := s.out.ReadString('\n')
		if err != nil {
			return sessionError{fmt.Errorf("nft session: %w", err)}
		}
		if strings.Contains(l, marker) {
			// The marker's error: its "Error:" line came just before,
			// and a line of carets follows.
			if _, err := s.out.ReadString('\n'); err != nil {
				return sessionError{fmt.Errorf("nft session: %w", err)}
			}
			if len(lines) > 0 {
				lines = lines[:len(lines)-1]
			}
			break
		}
		lines = append(lines, l)
	}
	s.last = strings.Join(lines, "")
	if out := strings.TrimSpace(s.last); strings.Contains(out, "Error") {
		return fmt.Errorf("nft: %s", out)
	}
	return nil
}

// output runs one command (a listing) and returns what it printed.
func (s *nftSession) output(cmd string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		if err := s.start(); err != nil {
			return "", err
		}
	}
	err := s.exchange(cmd)
	var broken sessionError
	if errors.As(err, &broken) {
		s.stop()
	}
	return s.last, err
}

func (s *nftSession) start() error {
	cmd := exec.Command("nft", "-i")
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return err
	}
	w.Close()
	s.cmd, s.in, s.raw, s.out = cmd, in, r, bufio.NewReader(r)
	return nil
}

func (s *nftSession) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.in.Close()
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	_ = s.raw.Close()
	s.cmd = nil
}

// close ends the session.
func (s *nftSession) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stop()
}
