package sandbox

// ring keeps the last values pushed, oldest first, up to a capacity: the
// bounded per-sandbox history of metrics samples and log entries. Its
// storage grows with use, so a short-lived sandbox costs little. Not safe
// for concurrent use; its owner locks.
type ring[T any] struct {
	buf   []T
	start int // index in buf of the oldest value, once buf is full
	limit int
}

func newRing[T any](limit int) *ring[T] { return &ring[T]{limit: max(limit, 1)} }

// push appends v, evicting the oldest value when full; evicted says
// whether one was, and old is it.
func (r *ring[T]) push(v T) (old T, evicted bool) {
	if len(r.buf) < r.limit {
		r.buf = append(r.buf, v)
		return old, false
	}
	old = r.buf[r.start]
	r.buf[r.start] = v
	r.start = (r.start + 1) % len(r.buf)
	return old, true
}

// popOldest removes and returns the oldest value.
func (r *ring[T]) popOldest() (T, bool) {
	var zero T
	if len(r.buf) == 0 {
		return zero, false
	}
	// Rotate into order, then drop the head: rare (byte-bounded logs only).
	r.buf = append(r.buf[r.start:], r.buf[:r.start]...)
	r.start = 0
	v := r.buf[0]
	r.buf[0] = zero
	r.buf = r.buf[1:]
	return v, true
}

func (r *ring[T]) len() int { return len(r.buf) }

// swap exchanges the i-th and j-th oldest values.
func (r *ring[T]) swap(i, j int) {
	i, j = (r.start+i)%len(r.buf), (r.start+j)%len(r.buf)
	r.buf[i], r.buf[j] = r.buf[j], r.buf[i]
}

// at is the i-th oldest value, 0 <= i < len.
func (r *ring[T]) at(i int) T { return r.buf[(r.start+i)%len(r.buf)] }

// last is the newest value.
func (r *ring[T]) last() (T, bool) {
	if len(r.buf) == 0 {
		var zero T
		return zero, false
	}
	return r.at(len(r.buf) - 1), true
}
