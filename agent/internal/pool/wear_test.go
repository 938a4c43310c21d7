package pool

import (
	"slices"
	"testing"
)

// Sandboxes retire after between MaxReuse less a tenth and MaxReuse runs,
// not all after the same number.
func TestPoolSpreadsRetirement(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	p := newTestPool(t, d, func(c *Config) { c.MinWarm, c.Max, c.MaxReuse = 1, 1, 20 })
	served := map[string]int{}
	var order []string
	for len(order) < 17 { // the 17th is still serving
		sb, err := p.Acquire(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := run(t, sb, "x"); err != nil {
			t.Fatal(err)
		}
		if served[sb.ID()] == 0 {
			order = append(order, sb.ID())
		}
		served[sb.ID()]++
		p.Release(t.Context(), sb, true)
	}
	var counts []int
	for _, id := range order[:16] {
		n := served[id]
		if n < 18 || n > 20 {
			t.Errorf("sandbox %s served %d runs, want 18 to 20 (MaxReuse 20, less at most a tenth)", id, n)
		}
		counts = append(counts, n)
	}
	slices.Sort(counts)
	if counts[0] == counts[len(counts)-1] {
		t.Errorf("16 sandboxes all served %d runs: retirement is not spread", counts[0])
	}
}
