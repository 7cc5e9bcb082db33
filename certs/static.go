package certs

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"time"
)

// StaticPoll is how often a static pair's files are checked for a change.
const StaticPoll = 30 * time.Second

// NewStatic serves the PEM pair in certFile and keyFile, logging as
// component tls. Run polls both
// files (their size and modification time, through symlinks, as certbot's
// live/ directory has them) every StaticPoll and loads the pair again when
// either changed; a pair that fails to load is logged and the previous one
// keeps serving until the files change again.
func NewStatic(certFile, keyFile string, log *slog.Logger) (*Manager, error) {
	s := &staticFiles{certFile: certFile, keyFile: keyFile}
	c, st, err := s.load()
	if err != nil {
		return nil, err
	}
	m := &Manager{log: log.With("component", "tls")}
	m.store(c)
	s.seen = st
	m.run = func(ctx context.Context) { s.watch(ctx, m, StaticPoll) }
	return m, nil
}

type staticFiles struct {
	certFile, keyFile string
	seen              [2]fileStamp // of the last load tried, good or not
}

// fileStamp tells a changed file from an unchanged one.
type fileStamp struct {
	mod  time.Time
	size int64
}

func (s *staticFiles) stamps() ([2]fileStamp, error) {
	var st [2]fileStamp
	for i, p := range []string{s.certFile, s.keyFile} {
		fi, err := os.Stat(p)
		if err != nil {
			return st, err
		}
		st[i] = fileStamp{fi.ModTime(), fi.Size()}
	}
	return st, nil
}

// load reads the pair; the stamps are taken first, so that a write
// during the read shows as a change at the next check.
func (s *staticFiles) load() (*tls.Certificate, [2]fileStamp, error) {
	st, err := s.stamps()
	if err != nil {
		return nil, st, err
	}
	certPEM, err := os.ReadFile(s.certFile)
	if err != nil {
		return nil, st, err
	}
	keyPEM, err := os.ReadFile(s.keyFile)
	if err != nil {
		return nil, st, err
	}
	c, err := keyPair(certPEM, keyPEM)
	if err != nil {
		return nil, st, fmt.Errorf("%s, %s: %w", s.certFile, s.keyFile, err)
	}
	return c, st, nil
}

// watch checks the files every interval until ctx ends.
func (s *staticFiles) watch(ctx context.Context, m *Manager, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.check(m)
		}
	}
}

// check loads the pair again if either file changed since the last try.
func (s *staticFiles) check(m *Manager) {
	st, err := s.stamps()
	if err != nil || st == s.seen {
		// A file missing for a moment (being replaced) is looked at
		// again at the next tick.
		return
	}
	c, st, err := s.load()
	s.seen = st
	if err != nil {
		m.log.Warn("tls: reload the certificate files; the previous certificate keeps serving", "err", err)
		return
	}
	m.store(c)
	m.log.Info("tls: certificate reloaded", append([]any{"cert", s.certFile}, certAttrs(c.Leaf)...)...)
}
