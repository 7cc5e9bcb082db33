package process

import (
	"errors"
	"slices"
	"testing"

	"github.com/sandboxd/sandboxd/envd/internal/agenttest"
)

func drain[T any](s *subscription[T]) []T {
	var out []T
	for v := range s.C() {
		out = append(out, v)
	}
	return out
}

func TestFanoutDeliversInOrderToEverySubscriber(t *testing.T) {
	agenttest.InProcessOnly(t, "unit test of fanout")
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
	agenttest.InProcessOnly(t, "unit test of fanout")
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
	agenttest.InProcessOnly(t, "unit test of fanout")
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

// published runs publish(v) in the background and reports when it returned.
func published[T any](f *fanout[T], v T) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		f.publish(v)
		close(done)
	}()
	return done
}

func TestFanoutBlockingSubscriberHoldsThePublisher(t *testing.T) {
	agenttest.InProcessOnly(t, "unit test of fanout")
	f := newFanout[int](2)
	slow, _ := f.subscribeBlocking()
	obs, _ := f.subscribe()
	f.publish(0)
	f.publish(1)
	pub := published(f, 2) // slow is full: waits for it
	if got := <-slow.C(); got != 0 {
		t.Fatalf("got %d; want 0", got)
	}
	<-pub // room was made
	pub = published(f, 3)
	if got := <-slow.C(); got != 1 {
		t.Fatalf("got %d; want 1", got)
	}
	<-pub
	f.finish(4) // slow is full again: it ends without 4, losing nothing else
	if got := drain(slow); !slices.Equal(got, []int{2, 3}) {
		t.Errorf("blocking subscriber then got %v; want [2 3]", got)
	}
	if slow.Err() != nil {
		t.Errorf("blocking Err = %v; want nil", slow.Err())
	}
	if got := drain(obs); !slices.Equal(got, []int{0, 1}) || !errors.Is(obs.Err(), errOverflow) {
		t.Errorf("observer got %v, %v; want [0 1] then errOverflow", got, obs.Err())
	}
}

func TestFanoutBlockingSubscriberCancelLetsThePublisherGo(t *testing.T) {
	agenttest.InProcessOnly(t, "unit test of fanout")
	f := newFanout[int](1)
	s, _ := f.subscribeBlocking()
	f.publish(0)
	pub := published(f, 1)
	s.cancel()
	<-pub
	if got := drain(s); len(got) > 2 {
		t.Errorf("cancelled subscriber got %v", got)
	}
	f.publish(2) // nobody to wait for
	s.cancel()
	f.finish(3)
}

func TestFanoutReleaseTurnsBlockingIntoOverflow(t *testing.T) {
	agenttest.InProcessOnly(t, "unit test of fanout")
	f := newFanout[int](2)
	s, _ := f.subscribeBlocking()
	f.publish(0)
	f.publish(1)
	pub := published(f, 2)
	f.release()
	<-pub
	f.release() // idempotent
	f.publish(3)
	f.finish(4)
	if got := drain(s); !slices.Equal(got, []int{0, 1}) || !errors.Is(s.Err(), errOverflow) {
		t.Errorf("released subscriber got %v, %v; want [0 1] then errOverflow", got, s.Err())
	}
}

func TestFanoutFinishDeliversLast(t *testing.T) {
	agenttest.InProcessOnly(t, "unit test of fanout")
	f := newFanout[int](2)
	s, _ := f.subscribeBlocking()
	o, _ := f.subscribe()
	f.publish(0)
	f.finish(1)
	for _, sub := range []*subscription[int]{s, o} {
		if got := drain(sub); !slices.Equal(got, []int{0, 1}) || sub.Err() != nil {
			t.Errorf("got %v, %v; want [0 1], nil", got, sub.Err())
		}
	}
	if _, ok := f.subscribeBlocking(); ok {
		t.Error("subscribeBlocking after finish succeeded")
	}
}
