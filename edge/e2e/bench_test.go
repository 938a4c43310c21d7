package e2e

import (
	"slices"
	"testing"
	"time"

	"github.com/codemode-go/codemode/internal/testkit/benchbase"
)

// settle is the pause after each call of a paired benchmark.
const settle = 60 * time.Millisecond

// pair is one side of a paired benchmark: a name and one call.
type pair struct {
	name string
	run  func()
}

// pairedLatency times a and b in turns, b.N times each after a warm-up,
// and reports the p50 and p95 of each, the ratio of their p50s (a over b),
// and the median of the paired differences: the two calls of a turn meet
// the same load on the machine, so their difference is steadier than
// either.
func pairedLatency(b *testing.B, a, c pair) {
	b.Helper()
	sides := []pair{a, c}
	lat := make([][]time.Duration, 2)
	timed := func(p pair) time.Duration {
		start := time.Now()
		p.run()
		return time.Since(start)
	}
	for range 5 {
		for _, p := range sides {
			timed(p)
		}
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for j := range sides {
			k := (i + j) % 2 // alternate which goes first
			lat[k] = append(lat[k], timed(sides[k]))
			// Let the agent scrub the sandbox and prestart the next
			// interpreter, so that each call meets a ready sandbox rather
			// than the previous call's clean-up.
			time.Sleep(settle)
		}
	}
	b.StopTimer()
	if len(lat[0]) == 0 || len(lat[1]) == 0 {
		return
	}
	diffs := make([]time.Duration, min(len(lat[0]), len(lat[1])))
	for k := range diffs {
		diffs[k] = lat[0][k] - lat[1][k]
	}
	var p50 [2]time.Duration
	for i, p := range sides {
		slices.Sort(lat[i])
		p50[i] = benchbase.Percentile(lat[i], 50)
		b.Logf("%-8s n=%d p50=%v p95=%v", p.name, len(lat[i]), p50[i].Round(10*time.Microsecond), benchbase.Percentile(lat[i], 95).Round(10*time.Microsecond))
	}
	ratio := float64(p50[0]) / float64(p50[1])
	slices.Sort(diffs)
	b.Logf("p50 ratio %s/%s = %.3f; median paired difference %s-%s = %v", a.name, c.name, ratio, a.name, c.name, benchbase.Percentile(diffs, 50).Round(10*time.Microsecond))
	b.ReportMetric(float64(p50[0].Microseconds()), "p50-"+a.name+"-us")
	b.ReportMetric(float64(p50[1].Microseconds()), "p50-"+c.name+"-us")
	b.ReportMetric(ratio, "p50-ratio")
	b.ReportMetric(float64(benchbase.Percentile(diffs, 50).Microseconds()), "paired-diff-us")
}
