package policy

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
)

// TestOnCall checks the report of each call: the decision, the fuel used
// of the budget, the time, and the failure of a call that failed.
func TestOnCall(t *testing.T) {
	t.Parallel()
	var (
		mu      sync.Mutex
		reports []CallReport
	)
	cfg := Config{Policies: []PolicyConfig{
		pol(t, "tenantblock", PhaseRequest, 1, "mallory"),
		pol(t, "trap", PhaseRequest, 2, ""),
	}}
	cfg.Policies[1].FailureMode = FailOpen
	opts := testOptions(t, writeConfig(t, "", cfg))
	opts.OnCall = func(r CallReport) {
		mu.Lock()
		reports = append(reports, r)
		mu.Unlock()
	}
	e, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })

	if _, err := e.EvaluateRequest(t.Context(), req("alice", "python", "1")); err != nil {
		t.Fatal(err)
	}
	_, err = e.EvaluateRequest(t.Context(), req("mallory", "python", "1"))
	wantDenial(t, err, "tenantblock", "tenant is suspended by the tenant policy", denied)

	mu.Lock()
	defer mu.Unlock()
	if len(reports) != 3 {
		t.Fatalf("%d reports, want 3 (tenantblock, trap, tenantblock): %+v", len(reports), reports)
	}
	allow, trap, deny := reports[0], reports[1], reports[2]
	for _, r := range []CallReport{allow, deny} {
		if r.Policy != "tenantblock" || r.Phase != PhaseRequest || r.Err != nil || r.Decision == nil {
			t.Errorf("report %+v, want tenantblock's decision", r)
		}
		if r.Fuel == 0 || r.Fuel >= r.FuelBudget || r.FuelBudget < DefaultFuel || r.Duration <= 0 || r.Duration > time.Minute {
			t.Errorf("report fuel %d of %d, time %v", r.Fuel, r.FuelBudget, r.Duration)
		}
	}
	if d, _ := deny.Decision.(*policyv1.RequestDecision); d.GetVerdict() != policyv1.Verdict_VERDICT_DENY {
		t.Errorf("deny report's decision %v", deny.Decision)
	}
	if trap.Policy != "trap" || !errors.Is(trap.Err, errTrap) || trap.Decision != nil {
		t.Errorf("trap report %+v, want a trap and no decision", trap)
	}
}
