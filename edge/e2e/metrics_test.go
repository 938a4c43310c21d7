package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
)

// metricsAddr returns where p serves /metrics, from its "serving metrics"
// log line.
func metricsAddr(t *testing.T, p *Process) string {
	t.Helper()
	r := waitLog(t, p, "serving metrics", nil)
	addr, _ := r["addr"].(string)
	if addr == "" {
		t.Fatalf("%s: serving metrics without an address: %v", p.Name, r)
	}
	return addr
}

// scrape reads p's /metrics and parses it as Prometheus text.
func scrape(t *testing.T, p *Process) map[string]*dto.MetricFamily {
	t.Helper()
	res, err := http.Get("http://" + metricsAddr(t, p) + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("%s /metrics: HTTP %d", p.Name, res.StatusCode)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatalf("%s /metrics does not parse: %v", p.Name, err)
	}
	return fams
}

// sample returns the value of the counter or gauge name whose labels
// include want, summed over the other labels.
func sample(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	var sum float64
	f := fams[name]
	if f == nil {
		return 0
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if labels[k] != v {
				continue next
			}
		}
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// startMetricsStack starts an agent, a control plane and an edge, each
// serving /metrics on a loopback port of its own.
func startMetricsStack(t *testing.T) *Stack {
	t.Helper()
	if binDir == "" {
		t.Skip("no Docker daemon reachable; run 'make setup'")
	}
	name := fmt.Sprintf("e2e-metrics-%d", os.Getpid())
	s := &Stack{AgentName: name, Secret: newSecret()}
	t.Cleanup(s.Stop)
	state, err := os.MkdirTemp(binDir, "agent-state-")
	if err != nil {
		t.Fatal(err)
	}
	env := append(s.ClusterEnv(), "METRICS_ADDR=127.0.0.1:0")
	if s.Agent, err = start("agent", env, "--addr", "127.0.0.1:0", "--name", name, "--runner", filepath.Join(binDir, "runner"), "--state-dir", state, "--min-active", "1"); err != nil {
		t.Fatal(err)
	}
	if s.ControlPlane, err = start("controlplane", append(env, "REMOTE_HOSTS="+s.Agent.Addr), "--addr", "127.0.0.1:0", "--poll-interval", "200ms"); err != nil {
		t.Fatal(err)
	}
	if s.Edge, err = s.StartEdge([]string{"METRICS_ADDR=127.0.0.1:0"}); err != nil {
		t.Fatal(err)
	}
	if err := s.waitAgentHealthy(timeoutHealthy); err != nil {
		t.Fatal(err)
	}
	return s
}

const timeoutHealthy = 2 * time.Minute

// TestMetrics makes runs through the edge and finds them counted, by door,
// language and outcome, in each service's /metrics.
func TestMetrics(t *testing.T) {
	t.Parallel()
	s := startMetricsStack(t)
	runs := []struct {
		proto    string
		opts     []connect.ClientOption
		language string
		code     string
		outcome  string
	}{
		{"connect", nil, "python", "print(1)", "ok"},
		{"connect", nil, "python", "print(2)", "ok"},
		{"grpc", []connect.ClientOption{connect.WithGRPC()}, "python", "print(3)", "ok"},
		{"grpc", []connect.ClientOption{connect.WithGRPC()}, "bash", "exit 3", "exit"},
	}
	for _, r := range runs {
		c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL(), r.opts...)
		if _, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: r.language, Code: r.code})); err != nil {
			t.Fatalf("execute: %v\n%s", err, s.Logs())
		}
	}
	const total = "codemode_executions_total"
	edge := scrape(t, s.Edge)
	for _, c := range []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"door": "connect", "language": "python", "outcome": "ok"}, 2},
		{map[string]string{"door": "grpc", "language": "python", "outcome": "ok"}, 1},
		{map[string]string{"door": "grpc", "language": "bash", "outcome": "exit"}, 1},
		{nil, 4},
	} {
		if got := sample(edge, total, c.labels); got != c.want {
			t.Errorf("edge %s%v = %v, want %v", total, c.labels, got, c.want)
		}
	}
	if got := sample(edge, "codemode_execution_seconds", nil); got != 4 {
		t.Errorf("edge codemode_execution_seconds count = %v, want 4", got)
	}
	for _, p := range []*Process{s.ControlPlane, s.Agent} {
		fams := scrape(t, p)
		for _, c := range []struct {
			labels map[string]string
			want   float64
		}{
			{map[string]string{"door": "rpc", "language": "python", "outcome": "ok"}, 3},
			{map[string]string{"door": "rpc", "language": "bash", "outcome": "exit"}, 1},
			{nil, 4},
		} {
			if got := sample(fams, total, c.labels); got != c.want {
				t.Errorf("%s %s%v = %v, want %v", p.Name, total, c.labels, got, c.want)
			}
		}
		if got := sample(fams, "codemode_run_seconds", nil); got != 4 {
			t.Errorf("%s codemode_run_seconds count = %v, want 4", p.Name, got)
		}
	}
	cp := scrape(t, s.ControlPlane)
	if got := sample(cp, "codemode_controlplane_routing_decisions_total", map[string]string{"kind": "stateless", "result": "chosen"}); got != 4 {
		t.Errorf("control plane routing decisions = %v, want 4", got)
	}
	if got := sample(cp, "codemode_controlplane_agent_healthy", map[string]string{"agent": s.Agent.Addr}); got != 1 {
		t.Errorf("control plane agent_healthy{agent=%s} = %v, want 1", s.Agent.Addr, got)
	}
	agent := scrape(t, s.Agent)
	if got := sample(agent, "codemode_queue_wait_seconds", nil); got != 4 {
		t.Errorf("agent codemode_queue_wait_seconds count = %v, want 4", got)
	}
	if got := sample(agent, "codemode_agent_sandboxes_max", nil); got < 1 {
		t.Errorf("agent codemode_agent_sandboxes_max = %v, want at least 1", got)
	}
	if agent["codemode_agent_sandboxes"] == nil || agent["codemode_agent_sessions"] == nil {
		t.Errorf("agent /metrics lacks pool gauges")
	}
	for name, fams := range map[string]map[string]*dto.MetricFamily{"edge": edge, "control plane": cp, "agent": agent} {
		for fname, f := range fams {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "tenant" {
						t.Errorf("%s metric %s has a tenant label", name, fname)
					}
				}
			}
		}
	}
}
