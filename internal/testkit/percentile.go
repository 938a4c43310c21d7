package testkit

import (
	"fmt"
	"testing"
	"time"

	"github.com/codemode-go/codemode/internal/testkit/benchbase"
)

// ReportPercentiles reports the p50, p95 and p99 of lat as metrics of b in
// unit, named for it: "p50-ns", "p95-ms" and so on, for a unit of a
// nanosecond, microsecond, millisecond or second. It reports nothing for no
// latencies and does not change lat.
func ReportPercentiles(b *testing.B, lat []time.Duration, unit time.Duration) {
	b.Helper()
	if len(lat) == 0 {
		return
	}
	name := unitName(unit)
	if name == "" {
		b.Fatalf("report percentiles in %v: not a nanosecond, microsecond, millisecond or second", unit)
	}
	for _, p := range []int{50, 95, 99} {
		b.ReportMetric(float64(benchbase.Percentile(lat, p))/float64(unit), fmt.Sprintf("p%d-%s", p, name))
	}
}

// unitName is unit's name in a metric's, as benchstat reads it; "" for
// another duration.
func unitName(unit time.Duration) string {
	switch unit {
	case time.Nanosecond:
		return "ns"
	case time.Microsecond:
		return "us"
	case time.Millisecond:
		return "ms"
	case time.Second:
		return "s"
	}
	return ""
}
