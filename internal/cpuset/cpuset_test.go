package cpuset

import (
	"slices"
	"testing"
)

func TestSplit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cpus  []int
		limit float64
		want  []string
	}{
		{[]int{0, 1}, 1, []string{"0", "1"}},
		{[]int{0, 1}, 0.5, []string{"0", "1"}},
		{[]int{0, 1}, 1.5, nil}, // one set of two: nothing to spread over
		{[]int{0}, 1, nil},
		{nil, 1, nil},
		{[]int{3, 1, 2, 0}, 2, []string{"0-1", "2-3"}},
		{[]int{0, 1, 2}, 1, []string{"0", "1", "2"}},
		{[]int{0, 1, 2, 3, 4}, 2, []string{"0-1", "2-4"}},
		{[]int{0, 2, 4, 6}, 2, []string{"0,2", "4,6"}},
		{[]int{0, 1, 2, 3, 4, 5, 6, 7}, 3, []string{"0-3", "4-7"}},
	} {
		if got := Split(c.cpus, c.limit); !slices.Equal(got, c.want) {
			t.Errorf("Split(%v, %v) = %q, want %q", c.cpus, c.limit, got, c.want)
		}
	}
}

func TestHost(t *testing.T) {
	t.Parallel()
	cpus, err := Host()
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) == 0 || !slices.IsSorted(cpus) || len(slices.Compact(slices.Clone(cpus))) != len(cpus) {
		t.Errorf("Host() = %v, want at least one CPU, sorted, each once", cpus)
	}
}
