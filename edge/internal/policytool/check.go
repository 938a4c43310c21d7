package policytool

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/codemode-go/codemode/edge/internal/policy"
)

// runCheck is `edge policy check`: load the module as the edge would, for
// its phase (both, when --phase is not given), and say what is wrong.
func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("check", stderr)
	if err := f.parse(args); err != nil {
		return err
	}
	phases := []string{*f.phase}
	if *f.phase == "" {
		phases = []string{policy.PhaseRequest, policy.PhaseResult}
	}
	var found []string
	for _, phase := range phases {
		s, err := f.setup(phase)
		if err != nil {
			return err
		}
		mode, err := Check(ctx, s)
		var abi *policy.ABIError
		if err != nil && *f.phase == "" && errors.As(err, &abi) && abi.Missing == phaseExport(phase) {
			continue // not a policy of this phase; the other may be
		}
		if err != nil {
			return fmt.Errorf("%s: %w", f.module, err)
		}
		found = append(found, phase+" ("+mode+")")
	}
	if len(found) == 0 {
		return fmt.Errorf("%s: %w", f.module, &policy.ABIError{Section: policy.ABIExports,
			Err: errors.New("module exports neither codemode_request nor codemode_result: it is a policy of no phase")})
	}
	fmt.Fprintf(stdout, "%s: follows policy ABI v1 for phase %s\n", f.module, joinComma(found))
	return nil
}

// Check loads the module s names with the edge's engine and returns how its
// calls are bounded: "instrumented" (fuel and the deadline) or "context"
// (the deadline only), or the load's error (a [*policy.ABIError] when the
// module does not follow the ABI).
func Check(ctx context.Context, s setup) (mode string, err error) {
	l, err := load(ctx, s)
	if err != nil {
		return "", err
	}
	defer l.close(ctx)
	for _, p := range l.engine.Status().Policies {
		mode = p.Interrupt
	}
	if mode == "context" {
		mode = "not instrumented: no fuel, only the deadline bounds a call"
	} else {
		mode = "calls counted in fuel"
	}
	return mode, nil
}

func phaseExport(phase string) string {
	if phase == policy.PhaseResult {
		return "codemode_result"
	}
	return "codemode_request"
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += " and "
		}
		out += x
	}
	return out
}
