package policy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// outcome is the decision a policy call ended in, as [Metrics] counts it.
type outcome int

const (
	// allowed, leaving the request or result as it was (annotations and
	// routes aside).
	outcomeAllow outcome = iota
	// allowed, changing the request (code, language, stdin, tighter
	// limits, egress) or redacting the result.
	outcomeRewrite
	outcomeDeny
	// the call failed (trap, timeout, invalid decision, no instance) and
	// the policy fails closed: denied.
	outcomeFailClosed
	// the call failed and the policy fails open: skipped.
	outcomeFailOpen
	// the caller went away during the call.
	outcomeCancelled
	outcomes
)

// outcomeNames are the values of the decision label.
var outcomeNames = [outcomes]string{"allow", "rewrite", "deny", "fail_closed", "fail_open", "cancelled"}

// Metrics count the decisions of policy calls and time them, by phase and
// policy name (the operator's, from the configuration: bounded, and no
// tenant's):
//
//   - codemode_policy_decisions_total{phase,policy,decision}: calls by the
//     decision they ended in (allow, rewrite, deny, fail_closed,
//     fail_open, cancelled);
//   - codemode_policy_call_seconds{phase,policy}: each call, from asking
//     for an instance to the decision checked.
//
// A policy keeps its series across reloads. Metrics are a
// [prometheus.Collector]; register them with the process's registry. A nil
// *Metrics records nothing. Safe for concurrent use.
type Metrics struct {
	decisions *prometheus.CounterVec
	seconds   *prometheus.HistogramVec
}

var _ prometheus.Collector = (*Metrics)(nil)

// NewMetrics returns policy metrics to pass in [Options].
func NewMetrics() *Metrics {
	return &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "codemode_policy_decisions_total",
			Help: "Policy calls by phase, policy and the decision they ended in (allow, rewrite, deny, fail_closed, fail_open, cancelled).",
		}, []string{"phase", "policy", "decision"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "codemode_policy_call_seconds",
			Help:    "Time of one policy call, waiting for an instance included.",
			Buckets: prometheus.ExponentialBucketsRange(0.00001, 1, 11),
		}, []string{"phase", "policy"}),
	}
}

// Describe implements [prometheus.Collector].
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.decisions.Describe(ch)
	m.seconds.Describe(ch)
}

// Collect implements [prometheus.Collector].
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.decisions.Collect(ch)
	m.seconds.Collect(ch)
}

// moduleMetrics are one policy's series, looked up once when it loads so
// that a call records without building label values.
type moduleMetrics struct {
	decisions [outcomes]prometheus.Counter
	seconds   prometheus.Observer
}

// module returns the series of the policy name in phase; nil when m is.
func (m *Metrics) module(phase, name string) *moduleMetrics {
	if m == nil {
		return nil
	}
	mm := &moduleMetrics{seconds: m.seconds.WithLabelValues(phase, name)}
	for o, d := range outcomeNames {
		mm.decisions[o] = m.decisions.WithLabelValues(phase, name, d)
	}
	return mm
}

// observe records a call that ended in o after elapsed.
func (mm *moduleMetrics) observe(o outcome, elapsed time.Duration) {
	if mm == nil {
		return
	}
	mm.decisions[o].Inc()
	mm.seconds.Observe(elapsed.Seconds())
}
