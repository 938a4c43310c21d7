package benchbase

import (
	"slices"
	"time"
)

// Percentile is the nearest-rank p-th percentile of lat; 0 for none. It
// does not change lat.
func Percentile(lat []time.Duration, p int) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}
