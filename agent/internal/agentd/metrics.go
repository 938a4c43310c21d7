package agentd

import (
	"github.com/prometheus/client_golang/prometheus"
)

// poolCollector reports the agent's sandboxes and sessions as they are at
// each scrape:
//
//   - codemode_agent_sandboxes{state}: sandboxes warm (ready for a run),
//     busy (running a stateless run), held (pinned to a session), starting
//     and recycling (being scrubbed or replaced);
//   - codemode_agent_sandboxes_max: the most the pool keeps;
//   - codemode_agent_sessions: open sessions;
//   - codemode_agent_ready: 1 once the pool has its warm sandboxes;
//   - codemode_agent_run_slots{state}: slots of the CPUs admitted (runs and
//     scrubs holding one) and runs waiting for one;
//   - codemode_agent_run_slots_max: the slots, 0 for no bound.
type poolCollector struct {
	svc      *Service
	sandbox  *prometheus.Desc
	max      *prometheus.Desc
	sessions *prometheus.Desc
	ready    *prometheus.Desc
	slots    *prometheus.Desc
	slotsMax *prometheus.Desc
}

var _ prometheus.Collector = (*poolCollector)(nil)

func newPoolCollector(svc *Service) *poolCollector {
	return &poolCollector{
		svc:      svc,
		sandbox:  prometheus.NewDesc("codemode_agent_sandboxes", "Sandboxes of the pool, by state.", []string{"state"}, nil),
		max:      prometheus.NewDesc("codemode_agent_sandboxes_max", "The most sandboxes the pool keeps.", nil, nil),
		sessions: prometheus.NewDesc("codemode_agent_sessions", "Open sessions.", nil, nil),
		ready:    prometheus.NewDesc("codemode_agent_ready", "1 when the engine answers and the pool has warmed.", nil, nil),
		slots:    prometheus.NewDesc("codemode_agent_run_slots", "Run slots admitted (runs and scrubs holding one) and runs waiting for one.", []string{"state"}, nil),
		slotsMax: prometheus.NewDesc("codemode_agent_run_slots_max", "Run slots: sandboxes working at once; 0 for no bound.", nil, nil),
	}
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.sandbox
	ch <- c.max
	ch <- c.sessions
	ch <- c.ready
	ch <- c.slots
	ch <- c.slotsMax
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.svc.pool.Stats()
	for state, n := range map[string]int{"warm": st.Warm, "busy": st.Busy, "held": st.Held, "starting": st.Starting, "recycling": st.Recycling} {
		ch <- prometheus.MustNewConstMetric(c.sandbox, prometheus.GaugeValue, float64(n), state)
	}
	ch <- prometheus.MustNewConstMetric(c.max, prometheus.GaugeValue, float64(st.Max))
	ch <- prometheus.MustNewConstMetric(c.sessions, prometheus.GaugeValue, float64(c.svc.sessions.Len()))
	ready := 0.0
	if st.Ready && st.Warmed {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, ready)
	gs := c.svc.gate.Stats()
	ch <- prometheus.MustNewConstMetric(c.slots, prometheus.GaugeValue, float64(gs.Admitted), "admitted")
	ch <- prometheus.MustNewConstMetric(c.slots, prometheus.GaugeValue, float64(gs.Waiting), "waiting")
	ch <- prometheus.MustNewConstMetric(c.slotsMax, prometheus.GaugeValue, float64(c.svc.gate.Slots()))
}
