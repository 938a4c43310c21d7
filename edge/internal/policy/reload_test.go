package policy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"github.com/codemode-go/codemode/gen/codemode/policy/v1/policyv1connect"
	"github.com/codemode-go/codemode/internal/testkit"
)

// tagged returns a chain of three fixed policies that each annotate the
// request with the tag, so that a verdict shows which generation's
// policies evaluated each step.
func tagged(t testing.TB, tag string) Config {
	var ps []PolicyConfig
	for i, name := range []string{"one", "two", "three"} {
		p := fixed(t, name, i, &policyv1.RequestDecision{
			Verdict:     policyv1.Verdict_VERDICT_ALLOW,
			Annotations: map[string]string{name: tag},
		})
		p.PoolSize = 2
		// Deadlines are not under test here; under -race on 2 cores a
		// starved call can pass 20 ms of wall time.
		p.Deadline = Duration(5 * time.Second)
		ps = append(ps, p)
	}
	return Config{Policies: ps}
}

func TestReloadUnderLoad(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, "", tagged(t, "v0"))
	e, err := New(context.Background(), testOptions(t, path))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())

	const workers, reloads = 4, 8
	var (
		stop     atomic.Bool
		wg       sync.WaitGroup
		mu       sync.Mutex
		tagOfGen = map[uint64]string{}
		served   atomic.Int64
		failures []string
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Bounded: at most 200000 requests per worker, stop when reloads end.
			for i := 0; i < 200000 && !stop.Load(); i++ {
				v, err := e.EvaluateRequest(context.Background(), req("t", "python", "1"))
				mu.Lock()
				switch {
				case err != nil:
					failures = append(failures, err.Error())
				case v.Annotations["one"] != v.Annotations["two"] || v.Annotations["two"] != v.Annotations["three"]:
					failures = append(failures, fmt.Sprintf("mixed generations in one chain: %v", v.Annotations))
				default:
					if tag, ok := tagOfGen[v.Generation]; ok && tag != v.Annotations["one"] {
						failures = append(failures, fmt.Sprintf("generation %d answered %s and %s", v.Generation, tag, v.Annotations["one"]))
					}
					tagOfGen[v.Generation] = v.Annotations["one"]
				}
				mu.Unlock()
				served.Add(1)
			}
		}()
	}
	var old []*generation
	for i := 1; i <= reloads; i++ {
		old = append(old, e.current.Load())
		writeConfig(t, path, tagged(t, fmt.Sprintf("v%d", i)))
		changed, err := e.Reload(t.Context())
		if err != nil || !changed {
			t.Fatalf("reload %d: changed=%v err=%v", i, changed, err)
		}
	}
	stop.Store(true)
	wg.Wait()
	for _, f := range failures[:min(len(failures), 5)] {
		t.Error(f)
	}
	if len(failures) > 0 {
		t.Fatalf("%d of %d requests failed", len(failures), served.Load())
	}
	if len(tagOfGen) < 2 {
		t.Errorf("requests saw %d generations, want several", len(tagOfGen))
	}
	t.Logf("%d requests over %d reloads saw %d generations", served.Load(), reloads, len(tagOfGen))
	// Every old generation drains and closes.
	for _, g := range old {
		select {
		case <-g.closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("generation %d never closed", g.id)
		}
	}
	if got := e.Generation(); got != reloads+1 {
		t.Errorf("generation = %d, want %d", got, reloads+1)
	}
}

func TestBrokenReloadKeepsServing(t *testing.T) {
	t.Parallel()
	good := Config{Policies: []PolicyConfig{pol(t, "tenantblock", PhaseRequest, 0, "mallory")}}
	path := writeConfig(t, "", good)
	e, err := New(context.Background(), testOptions(t, path))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())

	unchanged, err := e.Reload(t.Context())
	if err != nil || unchanged {
		t.Fatalf("reload of the same file: changed=%v err=%v", unchanged, err)
	}
	bad := good
	bad.Policies = []PolicyConfig{good.Policies[0]}
	bad.Policies[0].SHA256 = strings.Repeat("0", 64)
	for _, tc := range []struct {
		name  string
		write func()
		want  string
	}{
		{"not json", func() { os.WriteFile(path, []byte("{oops"), 0o644) }, "decode policy config"},
		{"digest mismatch", func() { writeConfig(t, path, bad) }, "module digest mismatch"},
	} {
		tc.write()
		if _, err := e.Reload(t.Context()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: reload error = %v, want %q", tc.name, err, tc.want)
		}
		if e.Generation() != 1 {
			t.Fatalf("%s: generation = %d, want 1 still serving", tc.name, e.Generation())
		}
		_, err := e.EvaluateRequest(t.Context(), req("mallory", "python", "1"))
		wantDenial(t, err, "tenantblock", "tenant is suspended by the tenant policy", denied)
		if s := e.Status(); !strings.Contains(s.LastReloadError, tc.want) {
			t.Fatalf("%s: status error = %q", tc.name, s.LastReloadError)
		}
	}

	// Watch picks up the fixed file.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go e.Watch(ctx, 10*time.Millisecond)
	fixedCfg := Config{Policies: []PolicyConfig{pol(t, "tenantblock", PhaseRequest, 0, "eve")}}
	writeConfig(t, path, fixedCfg)
	testkit.WaitFor(t, 10*time.Second, "Watch to reload the fixed configuration", func() bool { return e.Generation() != 1 })
	if _, err := e.EvaluateRequest(t.Context(), req("mallory", "python", "1")); err != nil {
		t.Fatalf("mallory after reload: %v", err)
	}
	_, err = e.EvaluateRequest(t.Context(), req("eve", "python", "1"))
	wantDenial(t, err, "tenantblock", "tenant is suspended by the tenant policy", denied)
	if s := e.Status(); s.LastReloadError != "" {
		t.Errorf("status error after a good reload = %q", s.LastReloadError)
	}
}

// A reload keeps the counters of the policies it keeps (same name, phase
// and module) and starts those of a changed module at zero.
func TestReloadKeepsCounters(t *testing.T) {
	t.Parallel()
	block := pol(t, "tenantblock", PhaseRequest, 0, "eve")
	other := fixed(t, "other", 1, &policyv1.RequestDecision{Verdict: policyv1.Verdict_VERDICT_ALLOW})
	// Deadlines are not under test here (see tagged).
	cfg := Config{Deadline: Duration(5 * time.Second), Policies: []PolicyConfig{block, other}}
	path := writeConfig(t, "", cfg)
	e, err := New(t.Context(), testOptions(t, path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	evaluate := func(n int) {
		t.Helper()
		for range n {
			if _, err := e.EvaluateRequest(t.Context(), req("mallory", "python", "1")); err != nil {
				t.Fatal(err)
			}
		}
	}
	allowed := func(name string) uint64 {
		t.Helper()
		return countersOf(t, e, name).Allowed
	}
	evaluate(3)
	if a, o := allowed("tenantblock"), allowed("other"); a != 3 || o != 3 {
		t.Fatalf("allowed = %d, %d; want 3, 3", a, o)
	}

	// Another configuration for tenantblock, another module for "other".
	block.Config = "eve, zed"
	other = pol(t, "tenantblock", PhaseRequest, 1, "nobody")
	other.Name = "other"
	cfg.Policies = []PolicyConfig{block, other}
	writeConfig(t, path, cfg)
	if changed, err := e.Reload(t.Context()); err != nil || !changed {
		t.Fatalf("Reload = %v, %v", changed, err)
	}
	if a, o := allowed("tenantblock"), allowed("other"); a != 3 || o != 0 {
		t.Fatalf("after the reload allowed = %d, %d; want 3 (kept), 0 (new module)", a, o)
	}
	evaluate(1)
	if a, o := allowed("tenantblock"), allowed("other"); a != 4 || o != 1 {
		t.Fatalf("allowed = %d, %d; want 4, 1", a, o)
	}
}

func TestAdminService(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, "", Config{Policies: []PolicyConfig{
		pol(t, "languages", PhaseRequest, 0, "*: python"),
		pol(t, "redact", PhaseResult, 0, ""),
	}})
	e, err := New(context.Background(), testOptions(t, path))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close(context.Background())
	_, _ = e.EvaluateRequest(t.Context(), req("t", "bash", "1"))

	mux := http.NewServeMux()
	mux.Handle(NewAdminHandler(e, "s3cret"))
	srv := httptest.NewServer(mux) // loopback
	defer srv.Close()
	client := policyv1connect.NewPolicyAdminServiceClient(srv.Client(), srv.URL)

	for _, token := range []string{"", "wrong"} {
		r := connect.NewRequest(&policyv1.ListPoliciesRequest{})
		if token != "" {
			r.Header().Set("Authorization", "Bearer "+token)
		}
		if _, err := client.ListPolicies(t.Context(), r); connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("token %q: err = %v, want unauthenticated", token, err)
		}
	}
	r := connect.NewRequest(&policyv1.ListPoliciesRequest{})
	r.Header().Set("Authorization", "Bearer s3cret")
	resp, err := client.ListPolicies(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	m := resp.Msg
	if m.Generation != 1 || len(m.Policies) != 2 || m.Policies[0].Name != "languages" || m.Policies[1].Phase != "result" ||
		m.Policies[0].Counters.GetDenied() != 1 || len(m.Policies[0].Sha256) != 64 || m.ConfigSha256 == "" ||
		m.Policies[0].Interrupt != "instrumented" {
		t.Errorf("ListPolicies = %v", m)
	}

	rr := connect.NewRequest(&policyv1.ReloadRequest{})
	rr.Header().Set("Authorization", "Bearer s3cret")
	if resp, err := client.Reload(t.Context(), rr); err != nil || resp.Msg.Changed || resp.Msg.Generation != 1 {
		t.Errorf("Reload = %v, %v; want unchanged generation 1", resp, err)
	}
	os.WriteFile(path, []byte("{"), 0o644)
	if _, err := client.Reload(t.Context(), rr); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("Reload of a broken file: err = %v, want failed_precondition", err)
	}

	mux2 := http.NewServeMux()
	mux2.Handle(NewAdminHandler(e, ""))
	srv2 := httptest.NewServer(mux2)
	defer srv2.Close()
	c2 := policyv1connect.NewPolicyAdminServiceClient(srv2.Client(), srv2.URL)
	r2 := connect.NewRequest(&policyv1.ListPoliciesRequest{})
	r2.Header().Set("Authorization", "Bearer ")
	if _, err := c2.ListPolicies(t.Context(), r2); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Errorf("admin without a token: err = %v, want unauthenticated", err)
	}
}
