package revert

import (
	"slices"
	"testing"
)

func TestFailRunsInReverseOnce(t *testing.T) {
	var got []int
	r := New()
	for i := range 3 {
		r.Add(func() { got = append(got, i) })
	}
	r.Fail()
	r.Fail()
	if want := []int{2, 1, 0}; !slices.Equal(got, want) {
		t.Fatalf("undos ran %v; want %v", got, want)
	}
}

func TestSuccessDropsUndos(t *testing.T) {
	ran := false
	r := New()
	r.Add(func() { ran = true })
	r.Success()
	r.Fail()
	r.Add(func() { ran = true })
	r.Fail()
	if ran {
		t.Fatal("undo ran after Success")
	}
}

func TestDeferredPattern(t *testing.T) {
	var got []string
	op := func(fail bool) {
		r := New()
		defer r.Fail()
		r.Add(func() { got = append(got, "a") })
		r.Add(func() { got = append(got, "b") })
		if fail {
			return
		}
		r.Success()
	}
	op(false)
	if len(got) != 0 {
		t.Fatalf("successful op ran undos %v", got)
	}
	op(true)
	if want := []string{"b", "a"}; !slices.Equal(got, want) {
		t.Fatalf("failed op ran %v; want %v", got, want)
	}
}

func TestClone(t *testing.T) {
	n := 0
	r := New()
	r.Add(func() { n++ })
	c := r.Clone()
	r.Success()
	r.Fail()
	c.Fail()
	if n != 1 {
		t.Fatalf("clone ran %d undos; want 1", n)
	}
}
