package controlplaned

import (
	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/codemode-go/codemode/controlplane/internal/router"
	"github.com/codemode-go/codemode/internal/telemetry"
)

// metrics are the control plane's own metrics, next to the execution
// metrics every service has:
//
//   - codemode_controlplane_routing_decisions_total{kind,result}: agents
//     chosen for a run (kind "stateless" or "session"), and refusals by
//     their Connect code;
//   - codemode_controlplane_agent_healthy{agent}: 1 while an agent
//     answers and is ready, by address;
//   - codemode_controlplane_agent_in_flight{agent}: calls this control
//     plane has open to each agent;
//   - codemode_controlplane_agent_registrations_total: heartbeats from
//     agents the control plane did not know (new, or forgotten);
//   - codemode_controlplane_agent_routing_changes_total{change}: agents
//     joining routing (joined) and leaving it (left: a failed status check
//     or call, a status not ready, missed heartbeats noticed at the next
//     pick or scrape, a name no longer resolving to it).
//
// A nil *metrics records nothing.
type metrics struct {
	*telemetry.Metrics
	routes *prometheus.CounterVec
}

func newMetrics(r *router.Router) *metrics {
	m := &metrics{
		Metrics: telemetry.NewMetrics(),
		routes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "codemode_controlplane_routing_decisions_total",
			Help: "Routing decisions: an agent chosen (result chosen) or none, by the refusal's Connect code.",
		}, []string{"kind", "result"}),
	}
	m.MustRegister(m.routes, &agentCollector{
		router:        r,
		healthy:       prometheus.NewDesc("codemode_controlplane_agent_healthy", "1 while the agent answers and is ready.", []string{"agent"}, nil),
		inFlight:      prometheus.NewDesc("codemode_controlplane_agent_in_flight", "Calls open to the agent.", []string{"agent"}, nil),
		registrations: prometheus.NewDesc("codemode_controlplane_agent_registrations_total", "Heartbeats from agents the control plane did not know.", nil, nil),
		changes:       prometheus.NewDesc("codemode_controlplane_agent_routing_changes_total", "Agents joining routing (joined) and leaving it (left).", []string{"change"}, nil),
	})
	return m
}

// route records a routing decision for a run in session sid ("": none).
func (m *metrics) route(sid string, err error) {
	if m == nil {
		return
	}
	kind, result := "stateless", "chosen"
	if sid != "" {
		kind = "session"
	}
	if err != nil {
		result = connect.CodeOf(err).String()
	}
	m.routes.WithLabelValues(kind, result).Inc()
}

func (m *metrics) execution() *telemetry.Metrics {
	if m == nil {
		return nil
	}
	return m.Metrics
}

// agentCollector reports the router's agents as they are at each scrape.
type agentCollector struct {
	router                                    *router.Router
	healthy, inFlight, registrations, changes *prometheus.Desc
}

var _ prometheus.Collector = (*agentCollector)(nil)

func (c *agentCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.healthy
	ch <- c.inFlight
	ch <- c.registrations
	ch <- c.changes
}

func (c *agentCollector) Collect(ch chan<- prometheus.Metric) {
	for _, a := range c.router.Agents() {
		h := 0.0
		if a.Healthy {
			h = 1
		}
		ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, h, a.Address)
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(a.InFlight), a.Address)
	}
	// Read after listing the agents, which notices missed heartbeats.
	n := c.router.Membership()
	ch <- prometheus.MustNewConstMetric(c.registrations, prometheus.CounterValue, float64(n.Registered))
	ch <- prometheus.MustNewConstMetric(c.changes, prometheus.CounterValue, float64(n.Joined), "joined")
	ch <- prometheus.MustNewConstMetric(c.changes, prometheus.CounterValue, float64(n.Left), "left")
}
