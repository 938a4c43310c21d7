package benchbase

import (
	"slices"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	t.Parallel()
	ms := func(v ...int) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // 100..1, unsorted
	}
	for _, tc := range []struct {
		name string
		lat  []time.Duration
		p    int
		want time.Duration
	}{
		{"none", nil, 50, 0},
		{"one", ms(7), 99, 7 * time.Millisecond},
		{"median of odd", ms(3, 1, 2), 50, 2 * time.Millisecond},
		{"median of even is the lower", ms(4, 1, 3, 2), 50, 2 * time.Millisecond},
		{"p95 of 100", ms(hundred...), 95, 95 * time.Millisecond},
		{"p99 of 100", ms(hundred...), 99, 99 * time.Millisecond},
		{"p99 of 10 is the largest", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10 * time.Millisecond},
		{"p0 is the smallest", ms(3, 1, 2), 0, 1 * time.Millisecond},
		{"p100 is the largest", ms(3, 1, 2), 100, 3 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := slices.Clone(tc.lat)
			if got := Percentile(tc.lat, tc.p); got != tc.want {
				t.Fatalf("Percentile(%v, %d) = %v, want %v", tc.lat, tc.p, got, tc.want)
			}
			if !slices.Equal(in, tc.lat) {
				t.Fatalf("Percentile reordered its input: %v, was %v", tc.lat, in)
			}
		})
	}
}
