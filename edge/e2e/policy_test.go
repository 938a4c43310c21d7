package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"github.com/codemode-go/codemode/gen/codemode/policy/v1/policyv1connect"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// API keys of the policy stack's tenants.
const (
	keyBob     = "k-bob-0123456789abcdef"
	keyAcme    = "k-acme-0123456789abcdef"
	keyMallory = "k-mallory-0123456789abcdef"
	adminToken = "policy-admin-0123456789"
)

// policyStack starts an agent labelled pool=blue, a control plane and an
// edge that loads every example policy:
//
//   - tenantblock (WAT) denies tenant mallory;
//   - languages allows python and bash;
//   - patterns denies dangerous code;
//   - prelude rewrites Python to lower the recursion limit to 200;
//   - limits caps bob's timeout at 2 s;
//   - routes sends bash to pool=blue and tenant acme to pool=green (no agent);
//   - redact removes AWS access key ids from output.
func policyStack(t testing.TB) (s *Stack, keys string) {
	t.Helper()
	dockertest.Need(t)
	dir := t.TempDir()
	mods, err := policytest.BuildInto(dir, "tenantblock", "languages", "patterns", "prelude", "limits", "routes", "redact")
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
	cfg := map[string]any{
		// The defaults: fuel bounds a call, and the 10 s deadline is only
		// a backstop that a call starved of CPU by -race on a loaded
		// machine does not reach.
		"labels": map[string][]string{"pool": {"blue", "green"}},
		"policies": []pc{
			p("tenantblock", "request", 5, "mallory"),
			p("languages", "request", 10, "*: python, bash"),
			p("patterns", "request", 20, ""),
			p("prelude", "request", 30, "import sys; sys.setrecursionlimit(200)"),
			p("limits", "request", 40, "bob: 2s\n*: 60s"),
			p("routes", "request", 50, "language bash: pool=blue\ntenant acme: pool=green"),
			p("redact", "result", 10, ""),
		},
	}
	b, _ := json.Marshal(cfg)
	config := filepath.Join(dir, "policies.json")
	keys = filepath.Join(dir, "keys.json")
	if err := os.WriteFile(config, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keys, []byte(fmt.Sprintf(`{%q: "bob", %q: "acme", %q: "mallory"}`, keyBob, keyAcme, keyMallory)), 0o600); err != nil {
		t.Fatal(err)
	}
	s = &Stack{AgentName: "e2e-policy-blue"}
	t.Cleanup(s.Stop)
	s.Agent, err = start("agent", nil, "--addr", "127.0.0.1:0", "--name", s.AgentName, "--runner", filepath.Join(binDir, "runner"),
		"--labels", "pool=blue", "--min-active", "2")
	if err != nil {
		t.Fatal(err)
	}
	s.ControlPlane, err = start("controlplane", []string{"REMOTE_HOSTS=" + s.Agent.Addr}, "--addr", "127.0.0.1:0", "--poll-interval", "200ms")
	if err != nil {
		t.Fatal(err)
	}
	s.Edge, err = start("edge", []string{"CODE_EXECUTION_HOST=" + s.ControlPlane.URL(), "CODEMODE_POLICY_CONFIG=" + config},
		"--addr", "127.0.0.1:0", "--api-keys", keys, "--policy-admin-token", adminToken)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.waitAgentHealthy(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	return s, keys
}

func withKey[T any](msg *T, key string) *connect.Request[T] {
	r := connect.NewRequest(msg)
	r.Header().Set("Authorization", "Bearer "+key)
	return r
}

// TestPolicies runs every example policy through the edge's doors.
func TestPolicies(t *testing.T) {
	t.Parallel()
	s, _ := policyStack(t)
	pc := &policiesCase{edge: s.Edge, logs: s.Logs}
	t.Run("allow", pc.allow)
	t.Run("deny on every protocol", pc.denyOnEveryProtocol)
	t.Run("deny dangerous pattern", pc.denyDangerousPattern)
	t.Run("deny tenant by the WAT policy", pc.denyTenantByTheWATPolicy)
	t.Run("deny on a stream", pc.denyOnAStream)
	t.Run("deny on MCP", pc.denyOnMCP)
	t.Run("rewrite", pc.rewrite)
	t.Run("limit tightened", pc.limitTightened)
	t.Run("route to the labelled agent", pc.routeToTheLabelledAgent)
	t.Run("sessions are placed by the route", pc.sessionsArePlacedByTheRoute)
	t.Run("redact", pc.redact)
	t.Run("redact a stream", pc.redactAStream)
	t.Run("redact on MCP", pc.redactOnMCP)
	t.Run("admin", pc.admin)
}

// policiesCase is TestPolicies' edge, in front of the policies of
// policyStack, and what its subtests call it with.
type policiesCase struct {
	edge *Process
	logs func() string
}

// client is a client of the edge over opts' protocol.
func (pc *policiesCase) client(opts ...connect.ClientOption) edgev1connect.ExecutionServiceClient {
	return edgev1connect.NewExecutionServiceClient(httpClient, pc.edge.URL(), opts...)
}

// run runs code in lang as the tenant of key.
func (pc *policiesCase) run(t *testing.T, key, lang, code string) (*edgev1.ExecuteResponse, error) {
	t.Helper()
	res, err := pc.client().Execute(t.Context(), withKey(&edgev1.ExecuteRequest{Language: lang, Code: code}, key))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// mustRun is run, failing t on an error.
func (pc *policiesCase) mustRun(t *testing.T, key, lang, code string) *edgev1.ExecuteResponse {
	t.Helper()
	res, err := pc.run(t, key, lang, code)
	if err != nil {
		t.Fatalf("execute %s: %v\n%s", lang, err, pc.logs())
	}
	return res
}

// leakyProgram prints an AWS access key to stdout and another to stderr.
const leakyProgram = "import sys\nprint('key=AKIA' + 'IOSFODNN7EXAMPLE')\nprint('AKIA' + 'IOSFODNN7EXAMPL2', file=sys.stderr)"

func (pc *policiesCase) allow(t *testing.T) {
	t.Parallel()
	r := pc.mustRun(t, keyBob, "python", "print(6*7)").GetResult()
	if r.GetStdout() != "42\n" || r.GetExitCode() != 0 {
		t.Fatalf("result %v", r)
	}
}

func (pc *policiesCase) denyOnEveryProtocol(t *testing.T) {
	t.Parallel()
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			_, err := pc.client(p.opts...).Execute(t.Context(), withKey(&edgev1.ExecuteRequest{Language: "javascript", Code: "console.log(1)"}, keyBob))
			wantDenied(t, err, "languages", "language javascript is not allowed for tenant bob (allowed: python, bash)")
		})
	}
}

func (pc *policiesCase) denyDangerousPattern(t *testing.T) {
	t.Parallel()
	_, err := pc.run(t, keyBob, "bash", ":(){ :|:& };:")
	wantDenied(t, err, "patterns", `dangerous pattern in code: fork bomb (":(){ :|:& };:")`)
}

func (pc *policiesCase) denyTenantByTheWATPolicy(t *testing.T) {
	t.Parallel()
	_, err := pc.run(t, keyMallory, "python", "print(1)")
	wantDenied(t, err, "tenantblock", "tenant is suspended by the tenant policy")
}

func (pc *policiesCase) denyOnAStream(t *testing.T) {
	t.Parallel()
	st, err := pc.client().ExecuteStream(t.Context(), withKey(&edgev1.ExecuteStreamRequest{Language: "javascript", Code: "1"}, keyBob))
	if err == nil {
		for st.Receive() {
		}
		err = st.Err()
	}
	wantDenied(t, err, "languages", "language javascript is not allowed for tenant bob (allowed: python, bash)")
}

func (pc *policiesCase) denyOnMCP(t *testing.T) {
	t.Parallel()
	res := callToolWithKey(t, pc.edge.URL()+"/mcp", keyBob, "execute_code", map[string]any{"language": "javascript", "code": "console.log(1)"})
	text := testkit.ToolText(res)
	if !res.IsError || !strings.Contains(text, "denied by policy languages") ||
		!strings.Contains(text, "language javascript is not allowed for tenant bob") {
		t.Fatalf("MCP result isError=%v %q, want an error naming the policy and reason", res.IsError, text)
	}
}

func (pc *policiesCase) rewrite(t *testing.T) {
	t.Parallel()
	r := pc.mustRun(t, keyBob, "python", "import sys\nprint(sys.getrecursionlimit())").GetResult()
	if r.GetStdout() != "200\n" {
		t.Fatalf("stdout %q, want the prelude's recursion limit 200", r.GetStdout())
	}
}

func (pc *policiesCase) limitTightened(t *testing.T) {
	t.Parallel()
	start := time.Now()
	r := pc.mustRun(t, keyBob, "python", "import time\ntime.sleep(20)\nprint('late')").GetResult()
	if !r.GetTimedOut() || strings.Contains(r.GetStdout(), "late") {
		t.Fatalf("result %v, want a run killed by bob's 2 s limit", r)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("run took %v: the policy's 2 s timeout did not apply", took)
	}
}

func (pc *policiesCase) routeToTheLabelledAgent(t *testing.T) {
	t.Parallel()
	r := pc.mustRun(t, keyBob, "bash", "echo routed").GetResult()
	if r.GetStdout() != "routed\n" || r.GetAgent() != "e2e-policy-blue" {
		t.Fatalf("result %v, want it run by e2e-policy-blue", r)
	}
	// acme is routed to pool=green, which no agent carries.
	_, err := pc.run(t, keyAcme, "python", "print(1)")
	if err == nil || !strings.Contains(err.Error(), "no healthy agent matches the route") {
		t.Fatalf("acme's run: err = %v, want no agent for pool=green", err)
	}
}

func (pc *policiesCase) sessionsArePlacedByTheRoute(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := pc.client()
	sess, err := c.CreateSession(ctx, withKey(&edgev1.CreateSessionRequest{Language: "bash"}, keyBob))
	if err != nil {
		t.Fatalf("bob's bash session: %v\n%s", err, pc.logs())
	}
	id := sess.Msg.GetSession().GetId()
	defer c.CloseSession(context.Background(), withKey(&edgev1.CloseSessionRequest{SessionId: id}, keyBob))
	if sess.Msg.GetSession().GetAgent() != "e2e-policy-blue" {
		t.Fatalf("session %v, want it on e2e-policy-blue", sess.Msg.GetSession())
	}
	res, err := c.Execute(ctx, withKey(&edgev1.ExecuteRequest{Language: "bash", Code: "cd /tmp; echo in", SessionId: id}, keyBob))
	if err != nil || res.Msg.GetResult().GetStdout() != "in\n" {
		t.Fatalf("run in the session: %v %v", res, err)
	}
	// acme is routed to pool=green, which no agent carries: no session
	// for acme anywhere else, explicit or opened by a file.
	_, err = c.CreateSession(ctx, withKey(&edgev1.CreateSessionRequest{Language: "python"}, keyAcme))
	if err == nil || !strings.Contains(err.Error(), "no healthy agent matches the route") {
		t.Fatalf("acme's session: err = %v, want no agent for pool=green", err)
	}
	_, err = c.WriteFile(ctx, withKey(&edgev1.WriteFileRequest{SessionId: "acme-files", File: &executionv1.File{Path: "a.txt", Content: []byte("a")}}, keyAcme))
	if err == nil || !strings.Contains(err.Error(), "no healthy agent matches the route") {
		t.Fatalf("acme's file into a new session: err = %v, want no agent for pool=green", err)
	}
	// A suspended tenant opens no session.
	_, err = c.CreateSession(ctx, withKey(&edgev1.CreateSessionRequest{Language: "python"}, keyMallory))
	if connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Fatalf("mallory's session: err = %v, want permission_denied", err)
	}
}

func (pc *policiesCase) redact(t *testing.T) {
	t.Parallel()
	r := pc.mustRun(t, keyBob, "python", leakyProgram).GetResult()
	if r.GetStdout() != "key=[REDACTED aws-access-key-id]\n" || r.GetStderr() != "[REDACTED aws-access-key-id]\n" {
		t.Fatalf("result %q %q, want the keys redacted", r.GetStdout(), r.GetStderr())
	}
}

func (pc *policiesCase) redactAStream(t *testing.T) {
	t.Parallel()
	st, err := pc.client(connect.WithGRPC()).ExecuteStream(t.Context(), withKey(&edgev1.ExecuteStreamRequest{Language: "python", Code: leakyProgram}, keyBob))
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr string
	for st.Receive() {
		stdout += st.Msg().GetEvent().GetStdout()
		stderr += st.Msg().GetEvent().GetStderr()
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	if stdout != "key=[REDACTED aws-access-key-id]\n" || stderr != "[REDACTED aws-access-key-id]\n" {
		t.Fatalf("streamed %q %q, want the keys redacted", stdout, stderr)
	}
}

func (pc *policiesCase) redactOnMCP(t *testing.T) {
	t.Parallel()
	res := callToolWithKey(t, pc.edge.URL()+"/mcp", keyBob, "execute_code", map[string]any{"language": "python", "code": leakyProgram})
	if res.IsError || strings.Contains(testkit.ToolText(res), "AKIA") || !strings.Contains(testkit.ToolText(res), "[REDACTED aws-access-key-id]") {
		t.Fatalf("MCP result isError=%v %q", res.IsError, testkit.ToolText(res))
	}
}

func (pc *policiesCase) admin(t *testing.T) {
	t.Parallel()
	admin := policyv1connect.NewPolicyAdminServiceClient(httpClient, pc.edge.URL())
	if _, err := admin.ListPolicies(t.Context(), connect.NewRequest(&policyv1.ListPoliciesRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("ListPolicies without token: %v", err)
	}
	res, err := admin.ListPolicies(t.Context(), withKey(&policyv1.ListPoliciesRequest{}, adminToken))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetGeneration() != 1 || len(res.Msg.GetPolicies()) != 7 {
		t.Fatalf("ListPolicies = %v", res.Msg)
	}
}

func wantDenied(t *testing.T, err error, policy, reason string) {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodePermissionDenied {
		t.Fatalf("err = %v, want permission_denied", err)
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if denial, ok := v.(*policyv1.Denial); derr == nil && ok {
			if denial.GetPolicy() != policy || denial.GetReason() != reason || denial.GetCause() != policyv1.Cause_CAUSE_DENIED {
				t.Fatalf("denial %v, want policy %q reason %q", denial, policy, reason)
			}
			return
		}
	}
	t.Fatalf("permission_denied without a Denial detail: %v", err)
}

// bearer adds an API key to every request.
type bearer struct {
	key  string
	next http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return b.next.RoundTrip(r)
}

// callToolWithKey calls an MCP tool as the tenant of key.
func callToolWithKey(t *testing.T, endpoint, key, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-policy", Version: "1"}, nil)
	hc := &http.Client{Transport: bearer{key: key, next: http.DefaultTransport}}
	cs, err := client.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connect MCP %s: %v", endpoint, err)
	}
	defer cs.Close()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: protocol error %v", name, err)
	}
	return res
}

// BenchmarkPolicyOverhead measures what the example chain adds to a run:
// print(1) through an edge with every example policy and through an edge
// without policies, in front of the same control plane and agent,
// interleaved in the same run.
//
//	go test -run '^$' -bench PolicyOverhead -benchtime 60x ./edge/e2e/
func BenchmarkPolicyOverhead(b *testing.B) {
	s, keys := policyStack(b)
	plain, err := start("edge", []string{"CODE_EXECUTION_HOST=" + s.ControlPlane.URL()}, "--addr", "127.0.0.1:0", "--api-keys", keys)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = plain.Stop(30 * time.Second) })
	edges := []struct {
		name string
		url  string
		lat  []time.Duration
	}{{name: "with policies", url: s.Edge.URL()}, {name: "without", url: plain.URL()}}
	ctx := context.Background()
	runOnce := func(url string) time.Duration {
		c := edgev1connect.NewExecutionServiceClient(httpClient, url)
		start := time.Now()
		res, err := c.Execute(ctx, withKey(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"}, keyBob))
		if err != nil || res.Msg.GetResult().GetStdout() != "1\n" {
			b.Fatalf("run: %v %v", res, err)
		}
		return time.Since(start)
	}
	for i := range edges { // warm both
		runOnce(edges[i].url)
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		e := &edges[i%2]
		e.lat = append(e.lat, runOnce(e.url))
	}
	b.StopTimer()
	p50 := make([]time.Duration, 2)
	for i, e := range edges {
		slices.Sort(e.lat)
		if len(e.lat) == 0 {
			return
		}
		p50[i] = e.lat[len(e.lat)/2]
		b.Logf("%-14s n=%d p50=%v p90=%v", e.name, len(e.lat), p50[i], e.lat[len(e.lat)*9/10])
	}
	b.ReportMetric(float64(p50[0].Microseconds()), "p50-with-us")
	b.ReportMetric(float64(p50[1].Microseconds()), "p50-without-us")
	b.ReportMetric(100*float64(p50[0]-p50[1])/float64(p50[1]), "overhead-%")
}
