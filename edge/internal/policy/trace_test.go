package policy

import (
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
)

// TestPolicySpans runs a chain of two request policies, the second
// denying, under a traced context, and checks one span per call with the
// policy's name, phase and decision, children of the request's span; and
// that an untraced context records nothing.
func TestPolicySpans(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Policies: []PolicyConfig{
		fixed(t, "first", 1, &policyv1.RequestDecision{Verdict: policyv1.Verdict_VERDICT_ALLOW}),
		fixed(t, "second", 2, &policyv1.RequestDecision{Verdict: policyv1.Verdict_VERDICT_DENY, Reason: "secret reason"}),
	}})
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, door := tp.Tracer("test").Start(t.Context(), "door")
	if _, err := e.EvaluateRequest(ctx, req("bob", "python", "print(1)")); err == nil {
		t.Fatal("the chain allowed the request")
	}
	door.End()
	if _, err := e.EvaluateRequest(t.Context(), req("bob", "python", "print(1)")); err == nil {
		t.Fatal("the chain allowed the request")
	}
	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 2 policy calls and the door", len(spans))
	}
	want := []struct{ name, decision string }{{"first", "allow"}, {"second", "deny"}}
	for i, w := range want {
		sp := spans[i]
		if sp.Name() != "policy "+w.name || sp.Parent().SpanID() != door.SpanContext().SpanID() {
			t.Errorf("span %d: %q, parent %v", i, sp.Name(), sp.Parent().SpanID())
		}
		got := map[string]string{}
		for _, kv := range sp.Attributes() {
			got[string(kv.Key)] = kv.Value.Emit()
		}
		if got["codemode.policy"] != w.name || got["codemode.policy.phase"] != "request" || got["codemode.policy.decision"] != w.decision || len(got) != 3 {
			t.Errorf("span %q attributes %v", sp.Name(), got)
		}
	}
}
