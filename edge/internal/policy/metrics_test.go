package policy

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/testkit"
)

// TestMetricsCountDecisions: every policy call is counted once, by the
// decision it ended in, and timed.
func TestMetricsCountDecisions(t *testing.T) {
	t.Parallel()
	advisory := fixedBytes(t, "advisory", 0, []byte{0xff}) // malformed: fails
	advisory.FailureMode = FailOpen
	strict := fixedBytes(t, "strict", 3, []byte{0xff}) // malformed: fails closed
	cfg := Config{Deadline: Duration(2 * time.Second), Policies: []PolicyConfig{
		advisory,
		pol(t, "languages", PhaseRequest, 1, "*: python"),
		pol(t, "prelude", PhaseRequest, 2, "x = 1"),
		strict,
		pol(t, "redact", PhaseResult, 1, ""),
	}}
	opts := testOptions(t, writeConfig(t, "", cfg))
	opts.Metrics = NewMetrics()
	e, err := New(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })

	// python: advisory fails open, languages allows, prelude rewrites,
	// strict fails closed. bash: advisory fails open, languages denies.
	if _, err := e.EvaluateRequest(t.Context(), req("t", "python", "print(1)")); err == nil {
		t.Fatal("python allowed, want strict to fail closed")
	}
	if _, err := e.EvaluateRequest(t.Context(), req("t", "bash", "echo")); err == nil {
		t.Fatal("bash allowed, want languages to deny")
	}
	for _, out := range []string{"id=AKIAIOSFODNN7EXAMPLE", "1\n", "2\n"} {
		r := &executionv1.Result{Stdout: out}
		if _, err := e.EvaluateResult(t.Context(), ResultInput{Result: r, Tenant: "t", Door: "connect", RequestID: "r", Language: "python"}); err != nil {
			t.Fatal(err)
		}
	}

	m := opts.Metrics
	for _, c := range []struct {
		phase, policy, decision string
		want                    float64
	}{
		{"request", "advisory", "fail_open", 2},
		{"request", "languages", "allow", 1},
		{"request", "languages", "deny", 1},
		{"request", "prelude", "rewrite", 1},
		{"request", "prelude", "allow", 0},
		{"request", "strict", "fail_closed", 1},
		{"result", "redact", "rewrite", 1},
		{"result", "redact", "allow", 2},
	} {
		if got := testkit.Written(t, m.decisions.WithLabelValues(c.phase, c.policy, c.decision)).GetCounter().GetValue(); got != c.want {
			t.Errorf("decisions{%s %s %s} = %v, want %v", c.phase, c.policy, c.decision, got, c.want)
		}
	}
	for policy, want := range map[string]uint64{"advisory": 2, "languages": 2, "prelude": 1, "strict": 1, "redact": 3} {
		phase := PhaseRequest
		if policy == "redact" {
			phase = PhaseResult
		}
		if got := testkit.Written(t, m.seconds.WithLabelValues(phase, policy).(prometheus.Histogram)).GetHistogram().GetSampleCount(); got != want {
			t.Errorf("call_seconds{%s %s} count = %d, want %d", phase, policy, got, want)
		}
	}
	// Five policies, each with its six decisions and its histogram.
	ch := make(chan prometheus.Metric, 100)
	m.Collect(ch)
	if n := len(ch); n != 5*len(outcomeNames)+5 {
		t.Errorf("%d series, want %d", n, 5*len(outcomeNames)+5)
	}
}
