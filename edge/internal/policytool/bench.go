package policytool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"
)

// runBench is `edge policy bench`: call the module on one input many times
// through the engine and print the calls' time percentiles and fuel.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f := newFlags("bench", stderr)
	input := f.fs.String("input", "", "JSON file of the input (a RequestInput, or a ResultInput with --phase result)")
	f.fs.Env("input", "CODEMODE_POLICY_INPUT")
	n := f.fs.Int("n", 2000, "calls to time, after 100 to warm up")
	f.fs.Env("n", "CODEMODE_POLICY_BENCH_N")
	if err := f.parse(args); err != nil {
		return err
	}
	if *input == "" {
		return errors.New("edge policy bench: give --input")
	}
	if *n < 1 {
		return errors.New("edge policy bench: -n must be at least 1")
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
	r, err := Bench(ctx, s, raw, *n)
	if err != nil {
		return fmt.Errorf("%s: %w", f.module, err)
	}
	fmt.Fprintf(stdout, "%s: %d calls, verdict %s\n", f.module, r.Calls, r.Verdict)
	fmt.Fprintf(stdout, "call time: p50 %v  p90 %v  p99 %v  max %v\n", r.P50, r.P90, r.P99, r.Max)
	if r.FuelBudget > 0 {
		fmt.Fprintf(stdout, "fuel:      %d units per call, of %d\n", r.Fuel, r.FuelBudget)
	} else {
		fmt.Fprintln(stdout, "fuel:      none (the module is not instrumented; only the deadline bounds a call)")
	}
	return nil
}

// BenchResult is what Bench measured: the time of a call, from taking a
// warm instance to checking the decision, as the edge's chain makes it.
type BenchResult struct {
	Calls              int
	Verdict            string
	P50, P90, P99, Max time.Duration
	// Fuel of the last call, and its budget (0 without fuel).
	Fuel, FuelBudget uint64
}

// Bench loads the module and times n calls on input, after 100 to warm up.
func Bench(ctx context.Context, s setup, input []byte, n int) (BenchResult, error) {
	l, err := load(ctx, s)
	if err != nil {
		return BenchResult{}, err
	}
	defer l.close(ctx)
	var r BenchResult
	times := make([]time.Duration, 0, n)
	for i := range n + 100 {
		if err := ctx.Err(); err != nil {
			return r, err
		}
		o, err := l.Evaluate(ctx, input)
		if err != nil {
			return r, err
		}
		if o.Verdict == "error" {
			return r, fmt.Errorf("the call failed: %w", o.Err)
		}
		r.Verdict, r.Fuel, r.FuelBudget = o.Verdict, o.Fuel, o.FuelBudget
		if i >= 100 {
			times = append(times, o.Duration)
		}
	}
	slices.Sort(times)
	at := func(q float64) time.Duration { return times[min(len(times)-1, int(q*float64(len(times))))] }
	r.Calls, r.P50, r.P90, r.P99, r.Max = len(times), at(0.5), at(0.9), at(0.99), times[len(times)-1]
	return r, nil
}
