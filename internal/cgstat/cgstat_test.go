package cgstat

import "testing"

func TestField(t *testing.T) {
	const stat = "nr_descendants 3\nnr_dying_descendants 17\nfile 4096\nanon x\n"
	for _, tc := range []struct {
		key    string
		want   uint64
		wantOK bool
	}{
		{"nr_dying_descendants", 17, true},
		{"nr_descendants", 3, true},
		{"file", 4096, true},
		{"descendants", 0, false}, // a suffix of a key is not the key
		{"anon", 0, false},        // not a count
		{"absent", 0, false},
		{"", 0, false},
	} {
		if got, ok := Field(stat, tc.key); got != tc.want || ok != tc.wantOK {
			t.Errorf("Field(%q) = %d, %v; want %d, %v", tc.key, got, ok, tc.want, tc.wantOK)
		}
	}
}
