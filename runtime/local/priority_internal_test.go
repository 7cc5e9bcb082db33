package local

import (
	goruntime "runtime"
	"testing"
)

// TestLowerThreadPriority: the calling thread runs at backgroundNice until
// the restore, which gives it its own value back (twice is once), and other
// threads are untouched.
func TestLowerThreadPriority(t *testing.T) {
	goruntime.LockOSThread() // read the thread the helper changes
	defer goruntime.UnlockOSThread()
	nice := func() int {
		n, err := threadNice()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := nice()
	restore := lowerThreadPriority()
	if got := nice(); got != backgroundNice {
		t.Errorf("nice while lowered = %d; want %d", got, backgroundNice)
	}
	other := make(chan int)
	go func() {
		goruntime.LockOSThread() // a thread of its own: not the lowered one
		defer goruntime.UnlockOSThread()
		n, _ := threadNice()
		other <- n
	}()
	if got := <-other; got != before {
		t.Errorf("another thread's nice = %d; want %d", got, before)
	}
	restore()
	restore()
	if got := nice(); got != before {
		t.Errorf("nice after restore = %d; want %d", got, before)
	}
}
