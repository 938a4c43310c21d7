package policy

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/testenv"
)

const denied = policyv1.Cause_CAUSE_DENIED

func TestLanguagesExample(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Policies: []PolicyConfig{
		pol(t, "languages", PhaseRequest, 0, "acme: python, bash\n*: python\n# comment\nnobody:"),
	}})
	ctx := t.Context()
	for _, tc := range []struct {
		name, tenant, lang, reason string
	}{
		{"acme bash", "acme", "bash", ""},
		{"acme python", "acme", "python", ""},
		{"acme javascript", "acme", "javascript", "language javascript is not allowed for tenant acme (allowed: python, bash)"},
		{"anonymous python", "anonymous", "python", ""},
		{"anonymous bash", "anonymous", "bash", "language bash is not allowed for tenant anonymous (allowed: python)"},
		{"nobody", "nobody", "python", "tenant nobody may not run code"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := req(tc.tenant, tc.lang, "print(1)")
			v, err := e.EvaluateRequest(ctx, in)
			if tc.reason != "" {
				wantDenial(t, err, "languages", tc.reason, denied)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if v.Execution != in.Execution || v.Route != nil {
				t.Errorf("allowed request changed: %+v", v)
			}
		})
	}
	c := countersOf(t, e, "languages")
	if c.Allowed != 3 || c.Denied != 3 {
		t.Errorf("counters = %v, want 3 allowed, 3 denied", c)
	}
}

func TestPatternsExample(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Policies: []PolicyConfig{
		pol(t, "patterns", PhaseRequest, 0, "curl http => downloading from the network"),
	}})
	for _, tc := range []struct{ name, code, reason string }{
		{"harmless", "print(sum(range(10)))", ""},
		{"fork bomb", ":(){ :|:& };:", `dangerous pattern in code: fork bomb (":(){ :|:& };:")`},
		{"rm root", "import os\nos.system('rm -rf / --no-preserve-root')", `dangerous pattern in code: deleting the root file system ("rm -rf /")`},
		{"configured", "curl http://x", `dangerous pattern in code: downloading from the network ("curl http")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.EvaluateRequest(t.Context(), req("t", "bash", tc.code))
			if tc.reason == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantDenial(t, err, "patterns", tc.reason, denied)
		})
	}
	in := req("t", "python", "exec(open('x.py').read())")
	in.Execution.Files = []*executionv1.File{{Path: "x.py", Content: []byte("import os\nos.fork()")}}
	_, err := e.EvaluateRequest(t.Context(), in)
	wantDenial(t, err, "patterns", `dangerous pattern in file x.py: forking processes from Python ("os.fork()")`, denied)
}

func TestLimitsExample(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Policies: []PolicyConfig{
		pol(t, "limits", PhaseRequest, 0, "acme: 60s\n*: 5s 65536"),
	}})
	for _, tc := range []struct {
		name        string
		in          RequestInput
		wantTimeout time.Duration // 0: unset
		wantOutput  uint64
	}{
		{"default tightened", req("bob", "python", "1"), 5 * time.Second, 65536},
		{"long tightened", withTimeout(req("bob", "python", "1"), time.Minute), 5 * time.Second, 65536},
		{"short kept", withTimeout(req("bob", "python", "1"), 2*time.Second), 2 * time.Second, 65536},
		{"acme default kept", req("acme", "python", "1"), 0, 0},
		{"acme long kept", withTimeout(req("acme", "python", "1"), 45*time.Second), 45 * time.Second, 0},
		{"acme longer tightened", withTimeout(req("acme", "python", "1"), 5*time.Minute), time.Minute, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := tc.in.Execution.GetTimeout().AsDuration()
			v, err := e.EvaluateRequest(t.Context(), tc.in)
			if err != nil {
				t.Fatal(err)
			}
			got := time.Duration(0)
			if v.Execution.Timeout != nil {
				got = v.Execution.Timeout.AsDuration()
			}
			if got != tc.wantTimeout || v.Execution.GetLimits().GetOutputBytes() != tc.wantOutput {
				t.Errorf("timeout, output = %v, %d; want %v, %d", got, v.Execution.GetLimits().GetOutputBytes(), tc.wantTimeout, tc.wantOutput)
			}
			if tc.in.Execution.GetTimeout().AsDuration() != orig {
				t.Errorf("input execution was modified")
			}
		})
	}
}

func TestRoutesExample(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{
		Labels: map[string][]string{"pool": {"acme", "node"}, "tier": nil},
		Policies: []PolicyConfig{
			pol(t, "routes", PhaseRequest, 0, "tenant acme: pool=acme, tier=gold\nlanguage javascript: pool=node"),
		},
	})
	for _, tc := range []struct {
		name, tenant, lang string
		want               map[string]string
	}{
		{"nothing", "bob", "python", nil},
		{"language", "bob", "javascript", map[string]string{"pool": "node"}},
		{"tenant wins", "acme", "javascript", map[string]string{"pool": "acme", "tier": "gold"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := e.EvaluateRequest(t.Context(), req(tc.tenant, tc.lang, "1"))
			if err != nil {
				t.Fatal(err)
			}
			if !equalMaps(v.Route, tc.want) {
				t.Errorf("route = %v, want %v", v.Route, tc.want)
			}
		})
	}
}

func TestPreludeExample(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Policies: []PolicyConfig{
		pol(t, "prelude", PhaseRequest, 0, "import sys; sys.setrecursionlimit(200)"),
	}})
	in := req("t", "python", "print(1)")
	v, err := e.EvaluateRequest(t.Context(), in)
	if err != nil {
		t.Fatal(err)
	}
	if want := "import sys; sys.setrecursionlimit(200)\nprint(1)"; v.Execution.Code != want {
		t.Errorf("code = %q, want %q", v.Execution.Code, want)
	}
	if in.Execution.Code != "print(1)" {
		t.Errorf("input execution was modified")
	}
	if v.Annotations["prelude"] != "applied" {
		t.Errorf("annotations = %v", v.Annotations)
	}
	v, err = e.EvaluateRequest(t.Context(), req("t", "bash", "echo 1"))
	if err != nil || v.Execution.Code != "echo 1" {
		t.Errorf("bash run = %v, %v; want unchanged", v.Execution, err)
	}
}

func TestRedactExample(t *testing.T) {
	t.Parallel()
	p := pol(t, "redact", PhaseResult, 0, "")
	e := newEngine(t, Config{Policies: []PolicyConfig{p}})
	key := "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA\n-----END RSA PRIVATE KEY-----"
	for _, tc := range []struct{ name, stdout, stderr, wantOut, wantErr string }{
		{"clean", "hello\n", "", "hello\n", ""},
		{"aws key", "id=AKIAIOSFODNN7EXAMPLE ok", "", "id=[REDACTED aws-access-key-id] ok", ""},
		{"not a key", "XAKIAIOSFODNN7EXAMPLE AKIA123", "", "XAKIAIOSFODNN7EXAMPLE AKIA123", ""},
		{"private key", "before\n" + key + "\nafter", "ASIAABCDEFGHIJKLMNOP", "before\n[REDACTED private-key]\nafter", "[REDACTED aws-access-key-id]"},
		{"cut short", "x -----BEGIN PRIVATE KEY-----\nMIIE", "", "x [REDACTED private-key]", ""},
		{"utf8 around", "é AKIAIOSFODNN7EXAMPLE é", "", "é [REDACTED aws-access-key-id] é", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &executionv1.Result{Stdout: tc.stdout, Stderr: tc.stderr, ExitCode: 3}
			v, err := e.EvaluateResult(t.Context(), ResultInput{Result: r, Tenant: "t", Door: "mcp", RequestID: "r", Language: "python"})
			if err != nil {
				t.Fatal(err)
			}
			if v.Result.Stdout != tc.wantOut || v.Result.Stderr != tc.wantErr || v.Result.ExitCode != 3 {
				t.Errorf("result = %q, %q, %d; want %q, %q, 3", v.Result.Stdout, v.Result.Stderr, v.Result.ExitCode, tc.wantOut, tc.wantErr)
			}
			if r.Stdout != tc.stdout {
				t.Errorf("input result was modified")
			}
		})
	}
}

func TestTenantBlockWAT(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Policies: []PolicyConfig{pol(t, "tenantblock", PhaseRequest, 0, "mallory")}})
	if _, err := e.EvaluateRequest(t.Context(), req("alice", "python", "1")); err != nil {
		t.Fatalf("alice: %v", err)
	}
	if _, err := e.EvaluateRequest(t.Context(), req("mallor", "python", "1")); err != nil {
		t.Fatalf("mallor: %v", err)
	}
	_, err := e.EvaluateRequest(t.Context(), req("mallory", "python", "1"))
	wantDenial(t, err, "tenantblock", "tenant is suspended by the tenant policy", denied)
	// A big input makes the WAT module grow its buffer.
	_, err = e.EvaluateRequest(t.Context(), req("mallory", "python", strings.Repeat("x", 200000)))
	wantDenial(t, err, "tenantblock", "tenant is suspended by the tenant policy", denied)
}

// exampleEgress is a tenant's egress for TestEgressExample: an API over the
// default ports, GitHub's content hosts and an address range over TLS, an
// address over plain HTTP, a configured API name, and a host on two ports.
func exampleEgress(connections uint32) *executionv1.Egress {
	return &executionv1.Egress{
		Allow: []*executionv1.EgressRule{
			egressRule("api.github.com"),
			egressRule("*.githubusercontent.com", 443),
			egressRule("192.0.2.0/24", 443),
			egressRule("198.51.100.7", 80),
			egressRule("github.api.codemode"),
			egressRule("example.org", 8080, 443),
		},
		Limits: &executionv1.EgressLimits{Connections: connections},
	}
}

func TestEgressExample(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Policies: []PolicyConfig{
		pol(t, "egress", PhaseRequest, 0, "*: https-only, no-wildcards, connections 16\nacme: https-only\nci-bot: read-only-apis\n# comment\npartner:"),
	}})
	for _, tc := range []struct {
		name, tenant string
		base         *executionv1.Egress
		want         []string
		wantConns    uint32
		annotation   string // "": none
	}{
		{
			name: "https only, no wildcards, 16 connections", tenant: "bob", base: exampleEgress(100),
			want:      []string{"api.github.com[443]", "github.api.codemode", "example.org[443]"},
			wantConns: 16, annotation: "kept 3 of 6 rules (https-only, no-wildcards, connections 16)",
		},
		{
			name: "the tenant's lower limit stays", tenant: "bob", base: exampleEgress(8),
			want:      []string{"api.github.com[443]", "github.api.codemode", "example.org[443]"},
			wantConns: 8, annotation: "kept 3 of 6 rules (https-only, no-wildcards, connections 16)",
		},
		{
			name: "https only keeps wildcards and prefixes", tenant: "acme", base: exampleEgress(100),
			want: []string{"api.github.com[443]", "*.githubusercontent.com[443]", "192.0.2.0/24[443]",
				"github.api.codemode", "example.org[443]"},
			wantConns: 100, annotation: "kept 5 of 6 rules (https-only)",
		},
		{
			name: "nothing to narrow", tenant: "partner", base: exampleEgress(100),
			want: []string{"api.github.com", "*.githubusercontent.com[443]", "192.0.2.0/24[443]",
				"198.51.100.7[80]", "github.api.codemode", "example.org[8080 443]"},
			wantConns: 100,
		},
		{
			name: "a tenant without egress keeps none", tenant: "bob", base: nil,
			want: nil, wantConns: 16, annotation: "kept 0 of 0 rules (https-only, no-wildcards, connections 16)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := e.EvaluateRequest(t.Context(), withEgress(req(tc.tenant, "python", "1"), tc.base))
			if err != nil {
				t.Fatal(err)
			}
			if got := hosts(v.Egress); !slices.Equal(got, tc.want) {
				t.Errorf("egress = %q, want %q", got, tc.want)
			}
			if got := v.Egress.GetLimits().GetConnections(); got != tc.wantConns {
				t.Errorf("connections = %d, want %d", got, tc.wantConns)
			}
			if v.Annotations["egress"] != tc.annotation {
				t.Errorf("annotation = %q, want %q", v.Annotations["egress"], tc.annotation)
			}
			if tc.annotation == "" && v.Egress != tc.base {
				t.Errorf("egress was replaced though the policy left it alone")
			}
		})
	}

	// API tool calls: ci-bot may only read.
	call := func(tenant, method string) RequestInput {
		in := withEgress(req(tenant, "python", ""), exampleEgress(100))
		in.Door = "mcp-api"
		in.APICall = &policyv1.ApiCall{Api: "github", Tool: "github_create_issue", ArgumentsJson: `{"title":"x"}`,
			Method: method, Url: "https://api.github.com/repos/o/r/issues"}
		return in
	}
	_, err := e.EvaluateRequest(t.Context(), call("ci-bot", "POST"))
	wantDenial(t, err, "egress", "tenant ci-bot may only read through API tools; github_create_issue is a POST", denied)
	if _, err := e.EvaluateRequest(t.Context(), call("ci-bot", "GET")); err != nil {
		t.Errorf("GET by ci-bot: %v", err)
	}
	if _, err := e.EvaluateRequest(t.Context(), call("partner", "POST")); err != nil {
		t.Errorf("POST by partner: %v", err)
	}
}

// TestEgressExampleInChain runs the egress example with modules that answer
// fixed decisions: one that narrows before it (the example sees what it
// left) and one after it that asks for far more than the tenant has (and
// gets none of it).
func TestEgressExampleInChain(t *testing.T) {
	t.Parallel()
	before := allowEgress(&executionv1.Egress{Allow: []*executionv1.EgressRule{
		egressRule("api.github.com"), egressRule("*.githubusercontent.com"), egressRule("example.org"),
	}})
	widen := allowEgress(&executionv1.Egress{
		Allow: []*executionv1.EgressRule{
			egressRule("*.com", 80, 443, 8080), egressRule("*.org"), egressRule("0.0.0.0/0"), egressRule("::/0"),
			egressRule("github.api.codemode"), egressRule("evil.example"),
		},
		Limits: &executionv1.EgressLimits{Connections: 1000},
	})
	e := newEngine(t, Config{Policies: []PolicyConfig{
		fixed(t, "before", 1, before),
		pol(t, "egress", PhaseRequest, 2, "*: https-only, connections 4"),
		fixed(t, "widen", 3, widen),
	}})
	v, err := e.EvaluateRequest(t.Context(), withEgress(req("bob", "python", "1"), exampleEgress(100)))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"api.github.com[443]", "*.githubusercontent.com[443]", "example.org[443]"}; !slices.Equal(hosts(v.Egress), want) {
		t.Errorf("egress = %q, want %q", hosts(v.Egress), want)
	}
	if c := v.Egress.GetLimits().GetConnections(); c != 4 {
		t.Errorf("connections = %d, want 4", c)
	}
	// The example saw the three rules "before" left, not the tenant's six.
	if want := "kept 3 of 3 rules (https-only, connections 4)"; v.Annotations["egress"] != want {
		t.Errorf("annotation = %q, want %q", v.Annotations["egress"], want)
	}
}

// TestChain checks how a chain combines: rewrites are seen by later
// policies, limits combine by minimum, routes by priority, any deny wins.
func TestChain(t *testing.T) {
	t.Parallel()
	labels := map[string][]string{"pool": nil, "zone": nil}
	allowWith := func(l *policyv1.Limits, route map[string]string, prio int32) *policyv1.RequestDecision {
		return &policyv1.RequestDecision{Verdict: policyv1.Verdict_VERDICT_ALLOW, Limits: l, Route: route, RoutePriority: prio}
	}
	e := newEngine(t, Config{Labels: labels, Policies: []PolicyConfig{
		fixed(t, "a", 1, allowWith(&policyv1.Limits{OutputBytes: 1000, MemoryBytes: 1 << 20}, map[string]string{"pool": "a", "zone": "a"}, 1)),
		fixed(t, "b", 2, allowWith(&policyv1.Limits{OutputBytes: 500, MemoryBytes: 1 << 30}, map[string]string{"pool": "b"}, 5)),
		fixed(t, "c", 3, allowWith(nil, map[string]string{"pool": "c", "zone": "c"}, 5)),
	}})
	v, err := e.EvaluateRequest(t.Context(), req("t", "python", "1"))
	if err != nil {
		t.Fatal(err)
	}
	if l := v.Execution.GetLimits(); l.GetOutputBytes() != 500 || l.GetMemoryBytes() != 1<<20 {
		t.Errorf("limits = %v, want output 500 memory 1MiB", l)
	}
	if want := map[string]string{"pool": "b", "zone": "c"}; !equalMaps(v.Route, want) {
		t.Errorf("route = %v, want %v", v.Route, want)
	}

	// The prelude adds a pattern that the next policy denies: it sees the rewrite.
	e2 := newEngine(t, Config{Policies: []PolicyConfig{
		pol(t, "prelude", PhaseRequest, 1, "import os; os.fork()"),
		pol(t, "patterns", PhaseRequest, 2, ""),
		pol(t, "languages", PhaseRequest, 3, "*: python"),
	}})
	_, err = e2.EvaluateRequest(t.Context(), req("t", "python", "print(1)"))
	wantDenial(t, err, "patterns", `dangerous pattern in code: forking processes from Python ("os.fork()")`, denied)
	if c := countersOf(t, e2, "languages"); c.Allowed+c.Denied != 0 {
		t.Errorf("policy after a deny ran: %v", c)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestBuildScript builds the examples with policies/build.sh, as make does,
// and loads the configuration it writes.
func TestBuildScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every example with -trimpath")
	}
	t.Parallel()
	root, err := testkit.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command("bash", "policies/build.sh", dir)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) && exit.ExitCode() == 3 { // a toolchain is missing
			testenv.Missing(t, "%s (run make setup)", strings.TrimSpace(string(out)))
		}
		t.Fatalf("build.sh: %v\n%s", err, out)
	}
	e, err := New(context.Background(), Options{ConfigPath: filepath.Join(dir, "policies.json"), CacheDir: policytest.CacheDir(t)})
	if err != nil {
		t.Fatalf("load the built configuration: %v", err)
	}
	defer e.Close(context.Background())
	if n := len(e.Status().Policies); n != 5 {
		t.Errorf("loaded %d policies, want 5", n)
	}
	if _, err := e.EvaluateRequest(t.Context(), req("t", "python", "print(1)")); err != nil {
		t.Errorf("print(1): %v", err)
	}
	_, err = e.EvaluateRequest(t.Context(), req("suspended-tenant", "python", "print(1)"))
	wantDenial(t, err, "tenantblock", "tenant is suspended by the tenant policy", denied)
}
