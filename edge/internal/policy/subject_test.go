package policy

import (
	"errors"
	"testing"
)

// TestSubjectReachesPolicies: the hashed subject of a caller with a token
// is in the RequestInput a policy decodes (field 8).
func TestSubjectReachesPolicies(t *testing.T) {
	t.Parallel()
	e := newEngine(t, Config{Policies: []PolicyConfig{pol(t, "gohostile", PhaseRequest, 0, "")}})
	in := req("acme", "python", "subject")
	in.Subject = "5d41402abc4b2a76b9719d911017c592"
	_, err := e.EvaluateRequest(t.Context(), in)
	var d *Denial
	if !errors.As(err, &d) || d.Reason != "subject=5d41402abc4b2a76b9719d911017c592" {
		t.Fatalf("EvaluateRequest: %v, want the policy's denial naming the subject", err)
	}
}
