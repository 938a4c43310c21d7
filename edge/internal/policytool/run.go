package policytool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// runCases is `edge policy run`: one input (--input) and what came of it,
// or a case file (--cases) and whether each case had the outcome it
// expects; a mismatch is an error, so that the command fails in CI.
func runCases(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("run", stderr)
	input := f.fs.String("input", "", "JSON file of one input: a codemode.policy.v1.RequestInput (or ResultInput with --phase result) in its JSON form")
	f.fs.Env("input", "CODEMODE_POLICY_INPUT")
	cases := f.fs.String("cases", "", "JSON file of cases: the phase, the module's config and inputs with the outcomes they expect (see policies/conformance)")
	f.fs.Env("cases", "CODEMODE_POLICY_CASES")
	if err := f.parse(args); err != nil {
		return err
	}
	if (*input == "") == (*cases == "") {
		return errors.New("edge policy run: give --input or --cases")
	}
	if *cases != "" {
		c, err := ReadCases(*cases)
		if err != nil {
			return err
		}
		s, err := f.setup(c.Phase)
		if err != nil {
			return err
		}
		s.config, s.labels = c.Config, c.Labels
		failed, err := RunCases(ctx, s, c, stdout)
		if err != nil {
			return err
		}
		if failed > 0 {
			return fmt.Errorf("%s: %d of %d cases failed", f.module, failed, len(c.Cases))
		}
		fmt.Fprintf(stdout, "%s: all %d cases passed\n", f.module, len(c.Cases))
		return nil
	}
	phase := *f.phase
	if phase == "" {
		phase = "request"
	}
	s, err := f.setup(phase)
	if err != nil {
		return err
	}
	raw, err := os.ReadFile(*input)
	if err != nil {
		return fmt.Errorf("read input: %w", err)
	}
	l, err := load(ctx, s)
	if err != nil {
		return fmt.Errorf("%s: %w", f.module, err)
	}
	defer l.close(ctx)
	o, err := l.Evaluate(ctx, raw)
	if err != nil {
		return err
	}
	printOutcome(stdout, o)
	return nil
}

// RunCases loads the module s names with the cases' configuration and runs
// every case, printing one line per case (and what did not match); it
// returns how many failed.
func RunCases(ctx context.Context, s setup, c *Cases, w io.Writer) (failed int, err error) {
	l, err := load(ctx, s)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", s.module, err)
	}
	defer l.close(ctx)
	for _, k := range c.Cases {
		o, err := l.Evaluate(ctx, k.Input)
		if err != nil {
			return failed, fmt.Errorf("case %s: %w", k.Name, err)
		}
		bad, err := k.Want.Mismatches(o)
		if err != nil {
			return failed, fmt.Errorf("case %s: %w", k.Name, err)
		}
		status := "ok  "
		if len(bad) > 0 {
			status = "FAIL"
			failed++
		}
		fmt.Fprintf(w, "%s %-52s %-5s %s\n", status, k.Name, o.Verdict, costOf(o))
		for _, b := range bad {
			fmt.Fprintf(w, "       %s\n", b)
		}
	}
	return failed, nil
}

// costOf is a call's fuel and time.
func costOf(o Outcome) string {
	fuel := "no fuel (not instrumented)"
	if o.FuelBudget > 0 {
		fuel = fmt.Sprintf("fuel %d of %d", o.Fuel, o.FuelBudget)
	}
	return fmt.Sprintf("%s, %v", fuel, o.Duration.Round(100*time.Nanosecond))
}

func printOutcome(w io.Writer, o Outcome) {
	fmt.Fprintf(w, "verdict:     %s\n", o.Verdict)
	if o.Reason != "" {
		fmt.Fprintf(w, "reason:      %s\n", o.Reason)
	}
	if o.Err != nil {
		fmt.Fprintf(w, "error:       %v\n", o.Err)
	}
	fmt.Fprintf(w, "decision:    %s\n", compact(o.Decision))
	if len(o.Annotations) > 0 {
		b, _ := json.Marshal(o.Annotations)
		fmt.Fprintf(w, "annotations: %s\n", b)
	}
	if o.Verdict == "allow" {
		switch {
		case o.Result != nil:
			fmt.Fprintf(w, "result:      %s\n", compact(o.Result))
		case o.Execution != nil:
			fmt.Fprintf(w, "execution:   %s\n", truncate(compact(o.Execution), 400))
			if len(o.Route) > 0 {
				b, _ := json.Marshal(o.Route)
				fmt.Fprintf(w, "route:       %s\n", b)
			}
			fmt.Fprintf(w, "egress:      %s\n", compact(orEmpty(o.Egress)))
		}
	}
	fmt.Fprintf(w, "cost:        %s\n", costOf(o))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "..."
}
