package sandbox

import "sync"

// idLocks serialises lifecycle actions per sandbox id. An id's entry lives
// only while someone holds or waits for its lock: the last unlock removes
// it, so the map holds the ids in use, not every id ever seen.
type idLocks struct {
	mu sync.Mutex
	m  map[string]*idLock
}

type idLock struct {
	mu   sync.Mutex
	refs int // holders and waiters; guarded by idLocks.mu
}

// lock takes id's lock and returns its unlock, which must be called once.
func (l *idLocks) lock(id string) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*idLock{}
	}
	e := l.m[id]
	if e == nil {
		e = &idLock{}
		l.m[id] = e
	}
	e.refs++
	l.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		l.mu.Lock()
		defer l.mu.Unlock()
		if e.refs--; e.refs == 0 {
			delete(l.m, id)
		}
	}
}

// len is the number of ids with a holder or a waiter.
func (l *idLocks) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
