package testkit

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Written returns the one metric c collects as it would be exposed, and
// fails tb if it cannot be written.
func Written(tb testing.TB, c prometheus.Collector) *dto.Metric {
	tb.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var pb dto.Metric
	if err := (<-ch).Write(&pb); err != nil {
		tb.Fatal(err)
	}
	return &pb
}
