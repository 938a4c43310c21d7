package policy

import (
	"fmt"
	"slices"
	"testing"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"google.golang.org/protobuf/proto"
)

func egressRule(host string, ports ...uint32) *executionv1.EgressRule {
	return &executionv1.EgressRule{Host: host, Ports: ports}
}

// tenantEgress is the egress a tenant's configuration might give: an API,
// GitHub's content hosts over TLS, one address.
func tenantEgress() *executionv1.Egress {
	return &executionv1.Egress{
		Allow: []*executionv1.EgressRule{
			egressRule("api.github.com"),
			egressRule("*.githubusercontent.com", 443),
			egressRule("192.0.2.7", 443),
			egressRule("github.api.codemode"),
		},
		Limits: &executionv1.EgressLimits{Connections: 10},
	}
}

func allowEgress(e *executionv1.Egress) *policyv1.RequestDecision {
	return &policyv1.RequestDecision{Verdict: policyv1.Verdict_VERDICT_ALLOW, Egress: e}
}

func withEgress(in RequestInput, e *executionv1.Egress) RequestInput {
	in.Egress = e
	return in
}

// hosts writes an Egress's rules as "host" or "host[ports]".
func hosts(e *executionv1.Egress) []string {
	var out []string
	for _, r := range e.GetAllow() {
		s := r.Host
		if len(r.Ports) > 0 {
			s += fmt.Sprint(r.Ports)
		}
		out = append(out, s)
	}
	return out
}

func TestEgressChain(t *testing.T) {
	t.Parallel()
	wide := &executionv1.Egress{
		Allow: []*executionv1.EgressRule{
			egressRule("*.com", 443, 8443), egressRule("0.0.0.0/0"), egressRule("::/0"), egressRule("evil.example"),
		},
		Limits: &executionv1.EgressLimits{Connections: 1000, Bytes: 1 << 20},
	}
	for _, tc := range []struct {
		name       string
		decisions  []*policyv1.RequestDecision
		want       []string // nil: no rules
		wantConns  uint32
		wantBytes  uint64
		wantSameIn bool // the verdict's egress is the input's own message
	}{
		{
			name:       "unset leaves it alone",
			decisions:  []*policyv1.RequestDecision{allowEgress(nil), allowEgress(nil)},
			want:       []string{"api.github.com", "*.githubusercontent.com[443]", "192.0.2.7[443]", "github.api.codemode"},
			wantConns:  10,
			wantSameIn: true,
		},
		{
			name:      "a wider decision is narrowed to the tenant's",
			decisions: []*policyv1.RequestDecision{allowEgress(wide)},
			want:      []string{"api.github.com[443]", "*.githubusercontent.com[443]", "192.0.2.7[443]"},
			wantConns: 10, wantBytes: 1 << 20,
		},
		{
			name:      "set with no rules allows nothing",
			decisions: []*policyv1.RequestDecision{allowEgress(&executionv1.Egress{})},
			want:      nil,
			wantConns: 10,
		},
		{
			name: "each policy narrows what the ones before left",
			decisions: []*policyv1.RequestDecision{
				allowEgress(&executionv1.Egress{Allow: []*executionv1.EgressRule{egressRule("api.github.com", 443), egressRule("github.api.codemode")},
					Limits: &executionv1.EgressLimits{Connections: 5}}),
				allowEgress(nil),
				allowEgress(&executionv1.Egress{Allow: []*executionv1.EgressRule{egressRule("api.github.com"), egressRule("*.githubusercontent.com")},
					Limits: &executionv1.EgressLimits{Connections: 8}}),
			},
			want:      []string{"api.github.com[443]"},
			wantConns: 5,
		},
		{
			name: "once nothing, always nothing",
			decisions: []*policyv1.RequestDecision{
				allowEgress(&executionv1.Egress{}),
				allowEgress(wide),
			},
			want:      nil,
			wantConns: 10, wantBytes: 1 << 20,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var pols []PolicyConfig
			for i, d := range tc.decisions {
				pols = append(pols, fixed(t, fmt.Sprintf("p%d", i+1), i, d))
			}
			e := newEngine(t, Config{Policies: pols})
			base := tenantEgress()
			in := withEgress(req("t", "python", "1"), base)
			v, err := e.EvaluateRequest(t.Context(), in)
			if err != nil {
				t.Fatal(err)
			}
			if got := hosts(v.Egress); !slices.Equal(got, tc.want) {
				t.Errorf("egress = %q, want %q", got, tc.want)
			}
			if v.Egress == nil {
				t.Fatal("egress = nil")
			}
			if l := v.Egress.GetLimits(); l.GetConnections() != tc.wantConns || l.GetBytes() != tc.wantBytes {
				t.Errorf("limits = %v, want %d connections, %d bytes", l, tc.wantConns, tc.wantBytes)
			}
			if (v.Egress == base) != tc.wantSameIn {
				t.Errorf("verdict's egress is the input's: %v, want %v", v.Egress == base, tc.wantSameIn)
			}
			if !proto.Equal(base, tenantEgress()) {
				t.Errorf("input egress was modified: %v", base)
			}
		})
	}
}

// TestEgressWithoutPolicies checks that the egress passes through an engine
// with no request policies, and with no configuration.
func TestEgressWithoutPolicies(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Policies: []PolicyConfig{pol(t, "redact", PhaseResult, 0, "")}})
	base := tenantEgress()
	v, err := e.EvaluateRequest(t.Context(), withEgress(req("t", "python", "1"), base))
	if err != nil || v.Egress != base {
		t.Errorf("EvaluateRequest = %v, %v; want the input's egress", v.Egress, err)
	}
}

// TestEgressMalformedFailsClosed checks that a decision with a malformed
// egress is an invalid decision, not one narrowed to something.
func TestEgressMalformedFailsClosed(t *testing.T) {
	t.Parallel()
	many := &executionv1.Egress{}
	for range 257 {
		many.Allow = append(many.Allow, egressRule("api.github.com"))
	}
	for _, tc := range []struct {
		name string
		e    *executionv1.Egress
	}{
		{"empty label", &executionv1.Egress{Allow: []*executionv1.EgressRule{egressRule("api..github.com")}}},
		{"wildcard inside", &executionv1.Egress{Allow: []*executionv1.EgressRule{egressRule("api.*.com")}}},
		{"port in host", &executionv1.Egress{Allow: []*executionv1.EgressRule{egressRule("api.github.com:443")}}},
		{"port zero", &executionv1.Egress{Allow: []*executionv1.EgressRule{egressRule("api.github.com", 0)}}},
		{"bad prefix", &executionv1.Egress{Allow: []*executionv1.EgressRule{egressRule("192.0.2.0/40")}}},
		{"too many rules", many},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := fixed(t, "bad", 0, allowEgress(tc.e))
			p.PoolSize = 1
			e := newEngine(t, Config{Policies: []PolicyConfig{p}})
			_, err := e.EvaluateRequest(t.Context(), withEgress(req("t", "python", "1"), tenantEgress()))
			wantDenial(t, err, "bad", ReasonUnavailable, unavailable)
			if c := countersOf(t, e, "bad"); c.InvalidDecisions != 1 {
				t.Errorf("counters = %v, want 1 invalid decision", c)
			}
		})
	}
	// Failing open skips the decision: the egress stays the tenant's.
	p := fixed(t, "advisory", 0, allowEgress(&executionv1.Egress{Allow: []*executionv1.EgressRule{egressRule("a..b")}}))
	p.FailureMode = FailOpen
	e := newEngine(t, Config{Policies: []PolicyConfig{p}})
	base := tenantEgress()
	v, err := e.EvaluateRequest(t.Context(), withEgress(req("t", "python", "1"), base))
	if err != nil || v.Egress != base {
		t.Errorf("fail open = %v, %v; want the tenant's egress", v.Egress, err)
	}
}
