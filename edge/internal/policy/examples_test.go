package policy

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
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
	dir := t.TempDir()
	cmd := exec.Command("bash", "policies/build.sh", dir)
	cmd.Dir = moduleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
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

func moduleRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}
