package main

import "testing"

func TestDyingCgroups(t *testing.T) {
	const hybrid = `#subsys_name	hierarchy	num_cgroups	enabled
cpuset	3	11	1
memory	4	386	1
devices	5	56	1
pids	8	56	1
`
	for _, tc := range []struct {
		name, in string
		want     int
	}{
		{"hybrid host after a CI run", hybrid, 330},
		{"none dying", "memory\t4\t56\t1\npids\t8\t56\t1\n", 0},
		{"fewer memory than pids", "memory\t4\t50\t1\npids\t8\t56\t1\n", 0},
		{"no pids hierarchy", "memory\t4\t56\t1\n", -1},
		{"empty", "", -1},
	} {
		if got := dyingV1(tc.in); got != tc.want {
			t.Errorf("%s: dyingV1 = %d, want %d", tc.name, got, tc.want)
		}
	}
}
