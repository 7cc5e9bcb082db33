package process

import (
	"errors"
	"slices"
	"testing"
)

func drain[T any](s *subscription[T]) []T {
	var out []T
	for v := range s.C() {
		out = append(out, v)
	}
	return out
}

func TestFanoutDeliversInOrderToEverySubscriber(t *testing.T) {
	f := newFanout[int](8)
	a, _ := f.subscribe()
	f.publish(1)
	b, _ := f.subscribe() // late: sees only what follows
	f.publish(2)
	f.publish(3)
	f.close()
	if got := drain(a); !slices.Equal(got, []int{1, 2, 3}) {
		t.Errorf("early subscriber got %v; want [1 2 3]", got)
	}
	if got := drain(b); !slices.Equal(got, []int{2, 3}) {
		t.Errorf("late subscriber got %v; want [2 3]", got)
	}
	if a.Err() != nil || b.Err() != nil {
		t.Errorf("Err after a normal close = %v, %v; want nil", a.Err(), b.Err())
	}
	if s, ok := f.subscribe(); ok || s != nil {
		t.Errorf("subscribe after close = %v, %v; want nil, false", s, ok)
	}
}

func TestFanoutOverflowDropsOnlyTheSlowSubscriber(t *testing.T) {
	f := newFanout[int](2)
	slow, _ := f.subscribe()
	fast, _ := f.subscribe()
	var got []int
	for i := range 5 {
		f.publish(i) // never blocks
		got = append(got, <-fast.C())
	}
	f.close()
	if !slices.Equal(got, []int{0, 1, 2, 3, 4}) {
		t.Errorf("fast subscriber got %v", got)
	}
	if got := drain(slow); !slices.Equal(got, []int{0, 1}) {
		t.Errorf("slow subscriber got %v; want what fit its buffer, [0 1]", got)
	}
	if !errors.Is(slow.Err(), errOverflow) {
		t.Errorf("slow Err = %v; want errOverflow", slow.Err())
	}
	if fast.Err() != nil {
		t.Errorf("fast Err = %v; want nil", fast.Err())
	}
}

func TestFanoutCancel(t *testing.T) {
	f := newFanout[int](1)
	s, _ := f.subscribe()
	s.cancel()
	s.cancel() // idempotent
	f.publish(1)
	if got := drain(s); len(got) != 0 {
		t.Errorf("cancelled subscriber got %v", got)
	}
	f.close()
	s.cancel() // after close, too
}
