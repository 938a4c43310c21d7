package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	dto "github.com/prometheus/client_model/go"

	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
	"github.com/codemode-go/codemode/internal/testkit/promtext"
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
	fams, err := promtext.Scrape(t.Context(), "http://"+metricsAddr(t, p)+"/metrics")
	if err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
	return fams
}

// startMetricsStack starts an agent, a control plane and an edge, each
// serving /metrics on a loopback port of its own. The edge loads three
// example policies: languages (python and bash only), prelude (rewrites
// Python) and redact (result phase).
func startMetricsStack(t *testing.T) *Stack {
	t.Helper()
	dockertest.Need(t)
	name := fmt.Sprintf("e2e-metrics-%d", os.Getpid())
	s := &Stack{AgentName: name, Secret: newSecret()}
	t.Cleanup(s.Stop)
	state, err := os.MkdirTemp(binDir, "agent-state-")
	if err != nil {
		t.Fatal(err)
	}
	policies := metricsPolicies(t)
	env := append(s.ClusterEnv(), "METRICS_ADDR=127.0.0.1:0")
	if s.Agent, err = start("agent", env, "--addr", "127.0.0.1:0", "--name", name, "--runner", filepath.Join(binDir, "runner"), "--state-dir", state, "--min-active", "1"); err != nil {
		t.Fatal(err)
	}
	if s.ControlPlane, err = start("controlplane", append(env, "REMOTE_HOSTS="+s.Agent.Addr), "--addr", "127.0.0.1:0", "--poll-interval", "200ms"); err != nil {
		t.Fatal(err)
	}
	if s.Edge, err = s.StartEdge([]string{"METRICS_ADDR=127.0.0.1:0", "CODEMODE_POLICY_CONFIG=" + policies}); err != nil {
		t.Fatal(err)
	}
	if err := s.waitAgentHealthy(timeoutHealthy); err != nil {
		t.Fatal(err)
	}
	return s
}

const timeoutHealthy = 2 * time.Minute

// metricsPolicies builds the metrics stack's policies and returns their
// configuration file.
func metricsPolicies(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	mods, err := policytest.BuildInto(dir, "languages", "prelude", "redact")
	if err != nil {
		t.Fatal(err)
	}
	type pc struct {
		Name   string `json:"name"`
		Path   string `json:"path"`
		SHA256 string `json:"sha256"`
		Phase  string `json:"phase"`
		Order  int    `json:"order"`
		Config string `json:"config,omitempty"`
	}
	p := func(name, phase string, order int, config string) pc {
		path := mods.Path(t, name)
		return pc{Name: name, Path: filepath.Base(path), SHA256: policytest.Digest(t, path), Phase: phase, Order: order, Config: config}
	}
	b, _ := json.Marshal(map[string]any{
		"policies": []pc{
			p("languages", "request", 10, "*: python, bash"),
			p("prelude", "request", 20, "import sys; sys.setrecursionlimit(200)"),
			p("redact", "result", 10, ""),
		},
	})
	config := filepath.Join(dir, "policies.json")
	if err := os.WriteFile(config, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return config
}

// settledAgentMetrics scrapes the agent until the scrubs after its
// stateless runs are done and no sandbox is starting or being scrubbed, so
// that its counters and gauges agree.
func settledAgentMetrics(t *testing.T, p *Process, runs float64) map[string]*dto.MetricFamily {
	t.Helper()
	var fams map[string]*dto.MetricFamily
	testkit.Eventually(t, time.Minute, func() error {
		fams = scrape(t, p)
		if promtext.Sample(fams, "codemode_agent_sandbox_scrubs_total", nil) >= runs &&
			promtext.Sample(fams, "codemode_agent_sandboxes", map[string]string{"state": "starting"}) == 0 &&
			promtext.Sample(fams, "codemode_agent_sandboxes", map[string]string{"state": "recycling"}) == 0 {
			return nil
		}
		return fmt.Errorf("agent not settled: scrubs %v, starting %v, recycling %v", promtext.Sample(fams, "codemode_agent_sandbox_scrubs_total", nil),
			promtext.Sample(fams, "codemode_agent_sandboxes", map[string]string{"state": "starting"}), promtext.Sample(fams, "codemode_agent_sandboxes", map[string]string{"state": "recycling"}))
	})
	return fams
}

// TestMetrics makes runs through the edge, one that a policy denies and a
// session, and finds them counted in each service's /metrics: runs by door,
// language and outcome, policy decisions, routing, and the agent's
// sandboxes and sessions.
func TestMetrics(t *testing.T) {
	t.Parallel()
	s := startMetricsStack(t)
	runForMetrics(t, s)
	edge := scrape(t, s.Edge)
	checkEdgeMetrics(t, edge)
	checkRunMetrics(t, s)
	cp := scrape(t, s.ControlPlane)
	checkControlPlaneMetrics(t, s, cp)
	agent := settledAgentMetrics(t, s.Agent, 4)
	checkAgentMetrics(t, agent)
	checkNoTenantLabel(t, map[string]map[string]*dto.MetricFamily{"edge": edge, "control plane": cp, "agent": agent})
	services := map[string]map[string]*dto.MetricFamily{"edge": edge, "control plane": cp, "agent": agent}
	checkOperatorMetrics(t, s, services)
	checkDeployedNames(t, services)
}

// checkDeployedNames checks that every metric the example alerting rules
// and the Grafana dashboard (deploy/) name is one a service exports.
func checkDeployedNames(t *testing.T, services map[string]map[string]*dto.MetricFamily) {
	names := regexp.MustCompile(`codemode_[a-z_]+`)
	suffix := regexp.MustCompile(`_(bucket|sum|count)$`)
	for _, file := range []string{"deploy/prometheus/alerts.yml", "deploy/grafana/codemode.json"} {
		b, err := os.ReadFile(filepath.Join(moduleRoot(), file))
		if err != nil {
			t.Fatal(err)
		}
		seen := 0
		for _, n := range names.FindAllString(string(b), -1) {
			n = suffix.ReplaceAllString(n, "")
			found := false
			for _, fams := range services {
				found = found || fams[n] != nil
			}
			if !found {
				t.Errorf("%s names %s, which no service exports", file, n)
			}
			seen++
		}
		if seen < 5 {
			t.Errorf("%s names %d metrics, want the dashboard's and rules' own", file, seen)
		}
	}
}

// checkOperatorMetrics checks what operators read besides executions: each
// service's build, the edge's MCP tool calls by tool and outcome, and
// requests refused at validation. services["edge"] becomes the edge's
// metrics after those calls.
func checkOperatorMetrics(t *testing.T, s *Stack, services map[string]map[string]*dto.MetricFamily) {
	for name, fams := range services {
		if got := promtext.Sample(fams, "codemode_build_info", nil); got != 1 {
			t.Errorf("%s codemode_build_info = %v, want 1", name, got)
		}
	}
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	if _, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python"})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("a run without code: %v, want invalid_argument", err)
	}
	cs := mcpSession(t, s.Edge.URL()+"/mcp")
	if _, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "list_languages"}); err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"language": "cobol", "code": "x"}})
	if err != nil || !res.IsError {
		t.Fatalf("execute_code in cobol: %v %v, want a tool error", res, err)
	}
	edge := scrape(t, s.Edge)
	services["edge"] = edge
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"codemode_requests_invalid_total", map[string]string{"procedure": "/codemode.edge.v1.ExecutionService/Execute"}, 1},
		{"codemode_mcp_tool_calls_total", map[string]string{"door": "mcp", "tool": "list_languages", "outcome": "ok"}, 1},
		{"codemode_mcp_tool_calls_total", map[string]string{"door": "mcp", "tool": "execute_code", "outcome": "tool_error"}, 1},
	} {
		if got := promtext.Sample(edge, c.name, c.labels); got != c.want {
			t.Errorf("edge %s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// executionsTotal is every service's counter of executions.
const executionsTotal = "codemode_executions_total"

// runForMetrics makes what TestMetrics counts: four runs over two
// protocols, one of them failing, a run denied by policy, and a session
// opened and closed.
func runForMetrics(t *testing.T, s *Stack) {
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
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	if _, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "sh", Code: "echo 1"})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("a run in sh: %v, want permission_denied by the languages policy", err)
	}
	sess, err := c.CreateSession(t.Context(), connect.NewRequest(&edgev1.CreateSessionRequest{Language: "python"}))
	if err != nil {
		t.Fatalf("create session: %v", err)
	}
	if _, err := c.CloseSession(t.Context(), connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: sess.Msg.GetSession().GetId()})); err != nil {
		t.Fatalf("close session: %v", err)
	}
}

// checkEdgeMetrics checks the edge's counts of executions and policy
// decisions.
func checkEdgeMetrics(t *testing.T, edge map[string]*dto.MetricFamily) {
	for _, c := range []struct {
		labels map[string]string
		want   float64
	}{
		{map[string]string{"door": "connect", "language": "python", "outcome": "ok"}, 2},
		{map[string]string{"door": "grpc", "language": "python", "outcome": "ok"}, 1},
		{map[string]string{"door": "grpc", "language": "bash", "outcome": "exit"}, 1},
		{map[string]string{"door": "connect", "language": "sh", "outcome": "permission_denied"}, 1},
		{nil, 5},
	} {
		if got := promtext.Sample(edge, executionsTotal, c.labels); got != c.want {
			t.Errorf("edge %s%v = %v, want %v", executionsTotal, c.labels, got, c.want)
		}
	}
	if got := promtext.Sample(edge, "codemode_execution_seconds", nil); got != 5 {
		t.Errorf("edge codemode_execution_seconds count = %v, want 5", got)
	}
	// Request policies see the five runs and the session's creation; the
	// languages policy stops the run in sh, so the prelude sees the other
	// four runs (three in Python, rewritten) and the session (Python,
	// rewritten). The result policy sees the four results.
	for _, c := range []struct {
		phase, policy, decision string
		want                    float64
	}{
		{"request", "languages", "allow", 5},
		{"request", "languages", "deny", 1},
		{"request", "prelude", "rewrite", 4},
		{"request", "prelude", "allow", 1},
		{"result", "redact", "allow", 4},
	} {
		labels := map[string]string{"phase": c.phase, "policy": c.policy, "decision": c.decision}
		if got := promtext.Sample(edge, "codemode_policy_decisions_total", labels); got != c.want {
			t.Errorf("edge codemode_policy_decisions_total%v = %v, want %v", labels, got, c.want)
		}
	}
	for policy, want := range map[string]float64{"languages": 6, "prelude": 5, "redact": 4} {
		if got := promtext.Sample(edge, "codemode_policy_decisions_total", map[string]string{"policy": policy}); got != want {
			t.Errorf("edge codemode_policy_decisions_total{policy=%s} = %v, want %v", policy, got, want)
		}
		if got := promtext.Sample(edge, "codemode_policy_call_seconds", map[string]string{"policy": policy}); got != want {
			t.Errorf("edge codemode_policy_call_seconds{policy=%s} count = %v, want %v", policy, got, want)
		}
	}
}

// checkRunMetrics checks the control plane's and the agent's counts of
// the runs.
func checkRunMetrics(t *testing.T, s *Stack) {
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
			if got := promtext.Sample(fams, executionsTotal, c.labels); got != c.want {
				t.Errorf("%s %s%v = %v, want %v", p.Name, executionsTotal, c.labels, got, c.want)
			}
		}
		if got := promtext.Sample(fams, "codemode_run_seconds", nil); got != 4 {
			t.Errorf("%s codemode_run_seconds count = %v, want 4", p.Name, got)
		}
	}
}

// checkControlPlaneMetrics checks the control plane's routing metrics.
func checkControlPlaneMetrics(t *testing.T, s *Stack, cp map[string]*dto.MetricFamily) {
	if got := promtext.Sample(cp, "codemode_controlplane_routing_decisions_total", map[string]string{"kind": "stateless", "result": "chosen"}); got != 4 {
		t.Errorf("control plane routing decisions = %v, want 4", got)
	}
	if got := promtext.Sample(cp, "codemode_controlplane_agent_healthy", map[string]string{"agent": s.Agent.Addr}); got != 1 {
		t.Errorf("control plane agent_healthy{agent=%s} = %v, want 1", s.Agent.Addr, got)
	}
	// The agent is polled (REMOTE_HOSTS), never registered, and in routing
	// now: it joined once more than it left.
	joined := promtext.Sample(cp, "codemode_controlplane_agent_routing_changes_total", map[string]string{"change": "joined"})
	left := promtext.Sample(cp, "codemode_controlplane_agent_routing_changes_total", map[string]string{"change": "left"})
	if joined != left+1 || joined < 1 {
		t.Errorf("control plane agent joined routing %v times and left %v, want once more joined", joined, left)
	}
	if got := promtext.Sample(cp, "codemode_controlplane_agent_registrations_total", nil); got != 0 || cp["codemode_controlplane_agent_registrations_total"] == nil {
		t.Errorf("control plane registrations = %v, want 0 for a polled agent", got)
	}
}

// checkAgentMetrics checks the settled agent's pool, slot, sandbox and
// session metrics.
func checkAgentMetrics(t *testing.T, agent map[string]*dto.MetricFamily) {
	if got := promtext.Sample(agent, "codemode_queue_wait_seconds", nil); got != 4 {
		t.Errorf("agent codemode_queue_wait_seconds count = %v, want 4", got)
	}
	if got := promtext.Sample(agent, "codemode_agent_sandboxes_max", nil); got < 1 {
		t.Errorf("agent codemode_agent_sandboxes_max = %v, want at least 1", got)
	}
	if agent["codemode_agent_sandboxes"] == nil || agent["codemode_agent_sessions"] == nil {
		t.Errorf("agent /metrics lacks pool gauges")
	}
	// On a host of two CPUs or more the agent pins its sandboxes (one CPU
	// each by default) and measures every set it pins to.
	if runtime.NumCPU() >= 2 {
		sets := agent["codemode_agent_cpu_set_speed_seconds"].GetMetric()
		if len(sets) < 2 {
			t.Errorf("agent codemode_agent_cpu_set_speed_seconds has %d sets, want one per CPU set (at least 2)", len(sets))
		}
		for _, m := range sets {
			if v := m.GetGauge().GetValue(); v <= 0 || v > 0.5 {
				t.Errorf("agent codemode_agent_cpu_set_speed_seconds%v = %v, want a few milliseconds", m.GetLabel(), v)
			}
		}
	}
	// Every run gave its slot to its sandbox's scrub, and every scrub has
	// ended: no slot is left taken.
	if got := promtext.Sample(agent, "codemode_agent_run_slots_max", nil); got < 1 {
		t.Errorf("agent codemode_agent_run_slots_max = %v, want at least 1 (one per CPU by default)", got)
	}
	for _, state := range []string{"admitted", "waiting"} {
		if got := promtext.Sample(agent, "codemode_agent_run_slots", map[string]string{"state": state}); got != 0 {
			t.Errorf("agent codemode_agent_run_slots{state=%q} = %v once settled, want 0", state, got)
		}
	}
	// Sandboxes: each of the four runs and the session took one, each run's
	// was scrubbed after it, the session's was destroyed when it closed;
	// every sandbox started is either still there or destroyed.
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"codemode_agent_sandbox_takes_total", nil, 5},
		{"codemode_agent_sandbox_scrubs_total", map[string]string{"result": "ok"}, 4},
		{"codemode_agent_sandbox_scrubs_total", nil, 4},
		{"codemode_agent_sandbox_scrub_seconds", nil, 4},
		{"codemode_agent_sandboxes_destroyed_total", map[string]string{"reason": "session_ended"}, 1},
		{"codemode_agent_sessions_opened_total", nil, 1},
		{"codemode_agent_sessions_closed_total", map[string]string{"reason": "closed"}, 1},
		{"codemode_agent_sessions_closed_total", nil, 1},
		{"codemode_agent_sessions", nil, 0},
	} {
		if got := promtext.Sample(agent, c.name, c.labels); got != c.want {
			t.Errorf("agent %s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	started := promtext.Sample(agent, "codemode_agent_sandbox_starts_total", map[string]string{"result": "ok"})
	if warm := promtext.Sample(agent, "codemode_agent_sandbox_starts_total", map[string]string{"for": "warm", "result": "ok"}); warm < 1 {
		t.Errorf("agent warm sandbox starts = %v, want at least the one of --min-active", warm)
	}
	if got := promtext.Sample(agent, "codemode_agent_sandbox_start_seconds", nil); got != started {
		t.Errorf("agent codemode_agent_sandbox_start_seconds count = %v, want one per start, %v", got, started)
	}
	destroyed := promtext.Sample(agent, "codemode_agent_sandboxes_destroyed_total", nil)
	if there := promtext.Sample(agent, "codemode_agent_sandboxes", nil); started-destroyed != there {
		t.Errorf("agent started %v sandboxes and destroyed %v, but has %v", started, destroyed, there)
	}
}

// checkNoTenantLabel checks that no metric of any service has a tenant
// label.
func checkNoTenantLabel(t *testing.T, services map[string]map[string]*dto.MetricFamily) {
	for name, fams := range services {
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
