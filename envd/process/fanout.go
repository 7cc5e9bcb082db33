package process

import (
	"fmt"
	"sync"

	"github.com/sandboxd/sandboxd/envd/rpcerr"
)

// errOverflow ends a subscription whose reader fell so far behind that its
// buffer filled up. Dropping the reader loudly is better than blocking the
// producer (the process would stall on a full pipe) or silently losing data.
var errOverflow = fmt.Errorf("%w: reader fell too far behind the process output", rpcerr.ErrResourceExhausted)

// fanout copies every published value to each subscriber's own buffered
// channel. Publishing never blocks: a subscriber whose buffer is full is
// disconnected with errOverflow, so one slow or vanished reader cannot hold up
// the producer or the other readers.
type fanout[T any] struct {
	size int // buffer of each subscriber's channel

	mu     sync.Mutex
	subs   map[*subscription[T]]struct{}
	closed bool
}

// subscription is one reader's view of a fanout.
type subscription[T any] struct {
	f   *fanout[T]
	c   chan T
	err error // set under f.mu before c is closed; read after receiving from closed c
}

func newFanout[T any](size int) *fanout[T] {
	return &fanout[T]{size: size, subs: map[*subscription[T]]struct{}{}}
}

// subscribe registers a reader that sees every value published from now on.
// ok is false once the fanout is closed: there is nothing more to see.
func (f *fanout[T]) subscribe() (s *subscription[T], ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, false
	}
	s = &subscription[T]{f: f, c: make(chan T, f.size)}
	f.subs[s] = struct{}{}
	return s, true
}

// publish hands v to every subscriber without blocking.
func (f *fanout[T]) publish(v T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		select {
		case s.c <- v:
		default:
			s.err = errOverflow
			f.dropLocked(s)
		}
	}
}

// close ends every subscription after the values already buffered.
func (f *fanout[T]) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for s := range f.subs {
		f.dropLocked(s)
	}
}

func (f *fanout[T]) dropLocked(s *subscription[T]) {
	delete(f.subs, s)
	close(s.c)
}

// C yields the published values; it is closed after close, cancel or an
// overflow (see Err).
func (s *subscription[T]) C() <-chan T { return s.c }

// Err says why C was closed early: errOverflow, or nil for a normal close.
// Only meaningful after C has been drained.
func (s *subscription[T]) Err() error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	return s.err
}

// cancel detaches the reader; safe to call more than once and after close.
func (s *subscription[T]) cancel() {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if _, ok := s.f.subs[s]; ok {
		s.f.dropLocked(s)
	}
}
