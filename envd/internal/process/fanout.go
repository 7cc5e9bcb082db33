package process

import (
	"fmt"
	"sync"

	"github.com/sandboxd/sandboxd/envd/internal/rpcerr"
)

// errOverflow ends a subscription whose reader fell so far behind that its
// buffer filled up. Dropping the reader loudly is better than blocking the
// producer (the process would stall on a full pipe) or silently losing data.
var errOverflow = fmt.Errorf("%w: reader fell too far behind the process output", rpcerr.ErrResourceExhausted)

// fanout copies every published value to each subscriber's own buffered
// channel, in one order for all of them.
//
// There are two kinds of subscribers. An observer (subscribe) never holds up
// the producer: when its buffer is full it is disconnected with errOverflow,
// so one slow or vanished observer cannot stall the producer or the other
// readers. A blocking subscriber (subscribeBlocking) applies backpressure:
// while it is attached and its buffer is full, publish waits for it, so the
// producer slows down to its pace and nothing is dropped for it. The wait
// ends when the reader makes room, when it cancels, or when the fanout is
// released; after release blocking subscribers are treated as observers.
type fanout[T any] struct {
	size int // buffer of each subscriber's channel

	// pubMu serializes publish, so that every subscriber sees values in the
	// same order even while a publisher waits for a blocking subscriber.
	pubMu sync.Mutex

	mu        sync.Mutex
	subs      map[*subscription[T]]struct{}
	closed    bool
	released  bool          // blocking subscribers no longer hold up publish
	releasedC chan struct{} // closed on release
}

// subscription is one reader's view of a fanout.
type subscription[T any] struct {
	f        *fanout[T]
	c        chan T
	blocking bool          // applies backpressure (see fanout)
	done     chan struct{} // closed once detached from the fanout
	// sending is set (under f.mu) while a publisher waits to send on c
	// outside the lock; c is then closed by that publisher, not by dropLocked.
	sending bool
	err     error // set under f.mu before c is closed; read after receiving from closed c
}

func newFanout[T any](size int) *fanout[T] {
	return &fanout[T]{size: size, subs: map[*subscription[T]]struct{}{}, releasedC: make(chan struct{})}
}

// subscribe registers an observer that sees every value published from now
// on and is disconnected with errOverflow if it falls a full buffer behind.
// ok is false once the fanout is closed: there is nothing more to see.
func (f *fanout[T]) subscribe() (s *subscription[T], ok bool) {
	return f.add(false)
}

// subscribeBlocking registers a reader that sees every value published from
// now on and that publish waits for when its buffer is full (backpressure).
func (f *fanout[T]) subscribeBlocking() (s *subscription[T], ok bool) {
	return f.add(true)
}

func (f *fanout[T]) add(blocking bool) (*subscription[T], bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, false
	}
	s := &subscription[T]{f: f, c: make(chan T, f.size), blocking: blocking, done: make(chan struct{})}
	f.subs[s] = struct{}{}
	return s, true
}

// publish hands v to every subscriber. It never blocks on an observer; it
// waits for a blocking subscriber whose buffer is full until that reader
// makes room, detaches, or the fanout is released.
func (f *fanout[T]) publish(v T) {
	f.pubMu.Lock()
	defer f.pubMu.Unlock()

	var wait []*subscription[T]
	f.mu.Lock()
	for s := range f.subs {
		select {
		case s.c <- v:
		default:
			if s.blocking && !f.released {
				s.sending = true
				wait = append(wait, s)
				continue
			}
			s.err = errOverflow
			f.dropLocked(s)
		}
	}
	f.mu.Unlock()

	for _, s := range wait {
		sent := false
		select {
		case s.c <- v:
			sent = true
		case <-s.done:
		case <-f.releasedC:
		}
		f.mu.Lock()
		s.sending = false
		if _, attached := f.subs[s]; !attached {
			close(s.c) // dropLocked left that to us
		} else if !sent {
			// Released while waiting: from now on s is an observer.
			select {
			case s.c <- v:
			default:
				s.err = errOverflow
				f.dropLocked(s)
			}
		}
		f.mu.Unlock()
	}
}

// release stops blocking subscribers from holding up publish, now and from
// then on: a publisher waiting for one goes on, and a reader that is still a
// full buffer behind is disconnected with errOverflow, like an observer.
// Safe to call more than once.
func (f *fanout[T]) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.released {
		f.released = true
		close(f.releasedC)
	}
}

// finish publishes last and ends every subscription after it; it never
// blocks. A blocking subscriber whose buffer is full when the producer
// finishes has lost nothing, so it ends normally without last (the stream
// sends the end event itself once it has drained the buffer); an observer in
// that state is disconnected with errOverflow, as publish would.
func (f *fanout[T]) finish(last T) {
	f.pubMu.Lock()
	defer f.pubMu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for s := range f.subs {
		select {
		case s.c <- last:
		default:
			if !s.blocking {
				s.err = errOverflow
			}
		}
		f.dropLocked(s)
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
	close(s.done)
	if !s.sending {
		close(s.c)
	}
}

// C yields the published values; it is closed after close, finish, cancel
// or an overflow (see Err).
func (s *subscription[T]) C() <-chan T { return s.c }

// Err says why C was closed early: errOverflow, or nil for a normal close.
// Only meaningful after C has been drained.
func (s *subscription[T]) Err() error {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	return s.err
}

// cancel detaches the reader; safe to call more than once and after close.
// A publisher waiting for this reader goes on.
func (s *subscription[T]) cancel() {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	if _, ok := s.f.subs[s]; ok {
		s.f.dropLocked(s)
	}
}
