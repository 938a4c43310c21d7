package pool

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics count what happens to sandboxes and sessions over their lives:
//
//   - codemode_agent_sandbox_starts_total{for,result}: sandboxes started,
//     for the warm pool (for="warm") or for a run or session waiting for
//     one (for="run"), by result (ok, error);
//   - codemode_agent_sandbox_start_seconds{for}: from starting the
//     container to its runner being ready, for those that started;
//   - codemode_agent_sandbox_takes_total{from}: sandboxes taken for a run
//     or a session: a warm one on its first use (from="warm"), a warm one
//     scrubbed after earlier runs ("reused"), or one started for the caller
//     ("cold");
//   - codemode_agent_sandbox_scrubs_total{result}: scrubs between two runs,
//     by result (ok, error);
//   - codemode_agent_sandbox_scrub_seconds: each scrub;
//   - codemode_agent_sandboxes_destroyed_total{reason}: sandboxes removed,
//     by why (see the reason constants);
//   - codemode_agent_cpu_set_speed_seconds{set}: the CPU time a fixed loop
//     last took on each CPU set sandboxes are pinned to (see
//     cpuset.Speed), the same on every set of an even host;
//   - codemode_agent_sessions_opened_total, and
//     codemode_agent_sessions_closed_total{reason}: closed on request
//     (closed), idle past their timeout (expired), or lost with their
//     sandbox or the agent's stop (lost).
//
// Every label's values are a fixed set. Metrics are a
// [prometheus.Collector]; pass them in [Config] and register them with the
// process's registry. A nil *Metrics records nothing. Safe for concurrent
// use.
type Metrics struct {
	starts         *prometheus.CounterVec
	startSeconds   *prometheus.HistogramVec
	takes          *prometheus.CounterVec
	scrubs         *prometheus.CounterVec
	scrubSeconds   prometheus.Histogram
	destroyed      *prometheus.CounterVec
	sessionsOpened prometheus.Counter
	sessionsClosed *prometheus.CounterVec
	setSpeed       *prometheus.GaugeVec
}

var _ prometheus.Collector = (*Metrics)(nil)

// Why a sandbox is destroyed: the values of the reason label.
const (
	destroyDied         = "died"          // a warm sandbox's container had stopped
	destroyNotReusable  = "not_reusable"  // its run timed out, ran out of memory or broke it
	destroyDedicated    = "dedicated"     // started for one run's own memory limit
	destroyMaxReuse     = "max_reuse"     // it served its most runs
	destroyScrubFailed  = "scrub_failed"  // the scrub after a run failed
	destroyIdle         = "idle"          // a warm sandbox beyond the minimum, unused too long
	destroySessionEnded = "session_ended" // its session ended
	destroyEngineAway   = "engine_away"   // the container engine went away
	destroyPoolClosed   = "pool_closed"   // the pool closed
	destroyImageChanged = "image_changed" // the sandbox image's name names another image now
)

// Where a sandbox for a run or a session comes from: the values of the
// from label.
const (
	takeWarm   = "warm"
	takeReused = "reused"
	takeCold   = "cold"
)

// NewMetrics returns pool metrics to pass in [Config].
func NewMetrics() *Metrics {
	buckets := prometheus.ExponentialBucketsRange(0.01, 60, 12)
	m := &Metrics{
		starts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "codemode_agent_sandbox_starts_total",
			Help: "Sandboxes started, for the warm pool (warm) or for a caller waiting (run), by result (ok, error).",
		}, []string{"for", "result"}),
		startSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "codemode_agent_sandbox_start_seconds",
			Help:    "Time from starting a sandbox's container to its runner being ready.",
			Buckets: buckets,
		}, []string{"for"}),
		takes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "codemode_agent_sandbox_takes_total",
			Help: "Sandboxes taken for a run or a session: warm on first use (warm), warm after a scrub (reused), or started for the caller (cold).",
		}, []string{"from"}),
		scrubs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "codemode_agent_sandbox_scrubs_total",
			Help: "Scrubs of a sandbox between two runs, by result (ok, error).",
		}, []string{"result"}),
		scrubSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "codemode_agent_sandbox_scrub_seconds",
			Help:    "Time of one scrub of a sandbox between two runs.",
			Buckets: buckets,
		}),
		destroyed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "codemode_agent_sandboxes_destroyed_total",
			Help: "Sandboxes removed, by reason (died, not_reusable, dedicated, max_reuse, scrub_failed, idle, session_ended, engine_away, pool_closed, image_changed).",
		}, []string{"reason"}),
		sessionsOpened: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "codemode_agent_sessions_opened_total",
			Help: "Sessions opened.",
		}),
		sessionsClosed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "codemode_agent_sessions_closed_total",
			Help: "Sessions ended, by reason (closed, expired, lost).",
		}, []string{"reason"}),
		setSpeed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "codemode_agent_cpu_set_speed_seconds",
			Help: "CPU time a fixed loop last took on each CPU set sandboxes are pinned to; runs favour the fastest.",
		}, []string{"set"}),
	}
	// Every series from the start, so that a rate is defined before the
	// first event.
	for _, f := range []string{"warm", "run"} {
		for _, r := range []string{"ok", "error"} {
			m.starts.WithLabelValues(f, r)
		}
	}
	for _, f := range []string{takeWarm, takeReused, takeCold} {
		m.takes.WithLabelValues(f)
	}
	for _, r := range []string{"ok", "error"} {
		m.scrubs.WithLabelValues(r)
	}
	for _, r := range []string{destroyDied, destroyNotReusable, destroyDedicated, destroyMaxReuse, destroyScrubFailed, destroyIdle, destroySessionEnded, destroyEngineAway, destroyPoolClosed, destroyImageChanged} {
		m.destroyed.WithLabelValues(r)
	}
	for _, r := range []EndReason{EndClosed, EndExpired, EndLost} {
		m.sessionsClosed.WithLabelValues(r.String())
	}
	return m
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.starts, m.startSeconds, m.takes, m.scrubs, m.scrubSeconds, m.destroyed, m.sessionsOpened, m.sessionsClosed, m.setSpeed}
}

// Describe implements [prometheus.Collector].
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements [prometheus.Collector].
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// started records a start for the warm pool (warm) or a caller, that took
// d and ended in err.
func (m *Metrics) started(warm bool, d time.Duration, err error) {
	if m == nil {
		return
	}
	f := "run"
	if warm {
		f = "warm"
	}
	m.starts.WithLabelValues(f, result(err)).Inc()
	if err == nil {
		m.startSeconds.WithLabelValues(f).Observe(d.Seconds())
	}
}

func (m *Metrics) took(from string) {
	if m == nil {
		return
	}
	m.takes.WithLabelValues(from).Inc()
}

func (m *Metrics) scrubbed(d time.Duration, err error) {
	if m == nil {
		return
	}
	m.scrubs.WithLabelValues(result(err)).Inc()
	m.scrubSeconds.Observe(d.Seconds())
}

func (m *Metrics) destroy(reason string) {
	if m == nil {
		return
	}
	m.destroyed.WithLabelValues(reason).Inc()
}

func (m *Metrics) sessionOpened() {
	if m == nil {
		return
	}
	m.sessionsOpened.Inc()
}

func (m *Metrics) sessionClosed(r EndReason) {
	if m == nil {
		return
	}
	m.sessionsClosed.WithLabelValues(r.String()).Inc()
}

func (m *Metrics) measured(set string, d time.Duration) {
	if m == nil {
		return
	}
	m.setSpeed.WithLabelValues(set).Set(d.Seconds())
}
