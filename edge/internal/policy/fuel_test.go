package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"
	"google.golang.org/protobuf/proto"

	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/testlog"
)

// fuelUsed loads p alone (one instance, the default fuel) and returns the
// units of work each input took. The deadline is an hour: megabytes of
// input under -race on a loaded machine can take longer than the default
// backstop, and only fuel is measured here.
func fuelUsed(t *testing.T, p PolicyConfig, inputs ...[]byte) []uint64 {
	t.Helper()
	p.PoolSize = 1
	p.Deadline = Duration(time.Hour)
	cfg := Config{Policies: []PolicyConfig{p}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	cache, err := wazero.NewCompilationCacheWithDir(policytest.CacheDir(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	m, err := loadModule(ctx, cfg.Policies[0], "", cache, discardLogger(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { m.close(ctx); cache.Close(ctx) }()
	if !m.interrupt {
		t.Fatalf("%s is not instrumented", p.Name)
	}
	var used []uint64
	for _, in := range inputs {
		if err := m.call(ctx, in, func([]byte) error { return nil }); err != nil {
			t.Fatalf("%s: call with %d bytes: %v", p.Name, len(in), err)
		}
		inst := <-m.pool.idle
		used = append(used, m.cfg.fuel(len(in))-inst.fuel.left())
		m.pool.put(inst)
	}
	return used
}

// exampleInputs are a request's or a result's input with code (or stdout)
// of each size.
func exampleInputs(t *testing.T, phase string, sizes []int) [][]byte {
	var ins [][]byte
	for _, n := range sizes {
		text := strings.Repeat("print('x = 1')\n", n/15+1)[:n]
		var msg proto.Message = &policyv1.RequestInput{
			Execution: &executionv1.Execution{Language: "python", Code: text},
			Tenant:    "acme", Door: "connect", RequestId: "req-1",
		}
		if phase == PhaseResult {
			msg = &policyv1.ResultInput{Result: &executionv1.Result{Stdout: text, Stderr: text[:n/8]},
				Tenant: "acme", Door: "connect", RequestId: "req-1", Language: "python"}
		}
		b, err := proto.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		ins = append(ins, b)
	}
	return ins
}

// TestExamplesFuel measures the fuel every example uses on inputs from a
// few bytes to 1 MiB (6 MiB for the result policy, which scans output),
// and checks that the default fuel leaves each at least a 20x margin (the
// figures are in RATIONALE.md).
func TestExamplesFuel(t *testing.T) {
	t.Parallel()
	chain := exampleChain(t)
	if err := chain.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, ex := range chain.Policies {
		t.Run(ex.Name, func(t *testing.T) {
			t.Parallel()
			sizes := []int{8, 4 << 10, 256 << 10, 1 << 20}
			if ex.Phase == PhaseResult {
				sizes = append(sizes, 6<<20)
			}
			ins := exampleInputs(t, ex.Phase, sizes)
			used := fuelUsed(t, ex, ins...)
			for i, u := range used {
				budget := ex.fuel(len(ins[i]))
				t.Logf("%s: %d bytes: %d units; default fuel %d is %.0fx that", ex.Name, sizes[i], u, budget, float64(budget)/float64(u))
				if u*20 > budget {
					t.Errorf("%s: %d bytes: %d units, more than a twentieth of the default fuel %d", ex.Name, sizes[i], u, budget)
				}
			}
		})
	}
}

// TestLoopIsStoppedByFuel runs endless loops with the default fuel and an
// hour's deadline: fuel stops them, soon, and the log says so.
func TestLoopIsStoppedByFuel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, module, code string }{
		{"wat", "loop", "x"},
		{"go", "gohostile", "loop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := pol(t, tc.module, PhaseRequest, 0, "")
			p.PoolSize = 1
			p.Deadline = Duration(time.Hour)
			var logs testlog.Buffer
			opts := testOptions(t, writeConfig(t, "", Config{Policies: []PolicyConfig{p}}))
			opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			e, err := New(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close(context.Background())
			in := req("t", "python", tc.code)
			start, cpu := time.Now(), processCPU()
			_, err = e.EvaluateRequest(t.Context(), in)
			took, cpuTook := time.Since(start), processCPU()-cpu
			wantDenial(t, err, tc.module, ReasonUnavailable, unavailable)
			t.Logf("runaway call ended after %v, %v of process CPU (deadline 1h)", took, cpuTook)
			// Fuel for a small input is about 10 ms of an empty loop; this
			// bound is loose for -race on a loaded machine.
			if took > 10*time.Second {
				t.Errorf("runaway call took %v", took)
			}
			if c := countersOf(t, e, tc.module); c.FuelExhausted != 1 || c.Timeouts != 0 || c.InstancesReplaced != 1 {
				t.Errorf("counters = %v, want 1 out of fuel, no timeout, 1 replaced", c)
			}
			if want := "fuel exhausted: the module did more than"; !strings.Contains(logs.String(), want) {
				t.Errorf("log does not say %q:\n%s", want, logs.String())
			}
		})
	}
}

// TestFuelBudget checks the budget of a call: the defaults, the file's
// values, a policy's own, and a sum too large for the guest's counter.
func TestFuelBudget(t *testing.T) {
	t.Parallel()
	const sha = `"sha256": "0000000000000000000000000000000000000000000000000000000000000000"`
	for _, tc := range []struct {
		name, json string
		input      int
		want       uint64
	}{
		{"defaults", `{"policies": [{"name": "a", "path": "a", ` + sha + `, "phase": "request"}]}`, 100, DefaultFuel + 100*DefaultFuelPerInputByte},
		{"file", `{"fuel": 1000, "fuel_per_input_byte": 2, "policies": [{"name": "a", "path": "a", ` + sha + `, "phase": "request"}]}`, 100, 1200},
		{"policy", `{"fuel": 1000, "policies": [{"name": "a", "path": "a", ` + sha + `, "phase": "request", "fuel": 5, "fuel_per_input_byte": 1}]}`, 100, 105},
		{"saturates", `{"policies": [{"name": "a", "path": "a", ` + sha + `, "phase": "request", "fuel": 18446744073709551615}]}`, 100, math.MaxInt64},
		{"saturates per byte", `{"policies": [{"name": "a", "path": "a", ` + sha + `, "phase": "request", "fuel_per_input_byte": 18446744073709551615}]}`, 2, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := ParseConfig([]byte(tc.json))
			if err != nil {
				t.Fatal(err)
			}
			if got := c.Policies[0].fuel(tc.input); got != tc.want {
				t.Errorf("fuel(%d) = %d, want %d", tc.input, got, tc.want)
			}
		})
	}
}

// TestNoMisfireUnderCPUContention runs the example chain, both phases, from
// 16 goroutines at once with the default fuel and deadline while CPU
// burners keep every core busy, and, beside it, endless loops against
// another engine. No request of the chain may fail, and every loop must be
// stopped by fuel: the budget is the guests' work, not the time they wait
// for a CPU. It does not run in parallel with the package's other tests:
// its burners would hold them back for as long as it runs, and it them.
func TestNoMisfireUnderCPUContention(t *testing.T) {
	e := newEngine(t, exampleChain(t))
	hp := pol(t, "gohostile", PhaseRequest, 0, "")
	hp.PoolSize = 1
	hostile := newEngine(t, Config{Policies: []PolicyConfig{hp}})

	// Burners: a spinning goroutine per P, until the test ends.
	defer burnCPU()()

	const workers, perWorker, loops = 16, 25, 4
	res := &executionv1.Result{Stdout: "1\nAKIAIOSFODNN7EXAMPLE\n" + strings.Repeat("output line\n", 200)}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []error
		// Latencies of each chain (both phases) and each looping call.
		chainTimes, loopTimes []time.Duration
	)
	fail := func(err error) {
		mu.Lock()
		failed = append(failed, err)
		mu.Unlock()
	}
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				in := req("acme", "python", fmt.Sprintf("print(%d)\n%s", i, strings.Repeat("x = 1\n", w*50)))
				s := time.Now()
				v, err := e.EvaluateRequest(t.Context(), in)
				if err != nil {
					fail(fmt.Errorf("request: %w", err))
					continue
				}
				r, err := e.EvaluateResult(t.Context(), ResultInput{Result: res, Tenant: in.Tenant, Door: in.Door,
					RequestID: in.RequestID, Language: v.Execution.Language, Annotations: v.Annotations})
				if err != nil {
					fail(fmt.Errorf("result: %w", err))
				} else if strings.Contains(r.Result.Stdout, "AKIA") {
					fail(errors.New("result not redacted"))
				}
				mu.Lock()
				chainTimes = append(chainTimes, time.Since(s))
				mu.Unlock()
			}
		})
	}
	wg.Go(func() {
		for range loops {
			s := time.Now()
			_, err := hostile.EvaluateRequest(t.Context(), req("t", "python", "loop"))
			if d, ok := err.(*Denial); !ok || d.Reason != ReasonUnavailable {
				fail(fmt.Errorf("looping policy: %v, want a policy_unavailable denial", err))
			}
			mu.Lock()
			loopTimes = append(loopTimes, time.Since(s))
			mu.Unlock()
			// Wait for the replacement instance, so that the next loop is
			// stopped by fuel rather than refused for want of an instance.
			testkit.Until(30*time.Second, func() bool {
				_, err := hostile.EvaluateRequest(t.Context(), req("t", "python", "ok"))
				return err == nil
			})
		}
	})
	wg.Wait()
	if len(chainTimes) == 0 {
		t.Fatalf("no chain succeeded: %v", failed)
	}
	slices.Sort(chainTimes)
	q := func(f float64) time.Duration {
		return chainTimes[min(len(chainTimes)-1, int(f*float64(len(chainTimes))))]
	}
	t.Logf("%d chains at concurrency %d beside %d CPU burners in %v: p50 %v, p99 %v, max %v; loops stopped after %v",
		len(chainTimes), workers, runtime.GOMAXPROCS(0), time.Since(start), q(0.5), q(0.99), chainTimes[len(chainTimes)-1], loopTimes)
	checkNoMisfire(t, e, hostile, failed, loops)
}

// checkNoMisfire reports the chains' failures, and fails unless the example
// chain's policies counted no failure and the looping one ran out of fuel loops times.
func checkNoMisfire(t *testing.T, e, hostile *Engine, failed []error, loops uint64) {
	for _, err := range failed {
		t.Error(err)
	}
	for _, p := range e.Status().Policies {
		if c := p.Counters; c.Timeouts+c.FuelExhausted+c.Unavailable+c.Traps != 0 {
			t.Errorf("policy %s counters = %v, want no failure", p.Name, c)
		}
	}
	if c := countersOf(t, hostile, "gohostile"); c.FuelExhausted != loops || c.Timeouts != 0 {
		t.Errorf("looping policy counters = %v, want %d out of fuel and no timeout", c, loops)
	}
}

// burnCPU starts a spinning goroutine per P; they run until the function
// it returns is called, which waits for them.
func burnCPU() func() {
	stop := make(chan struct{})
	var burners sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		burners.Go(func() {
			for n := 0; ; n++ {
				if n%4096 == 0 {
					select {
					case <-stop:
						return
					default:
					}
				}
			}
		})
	}
	return func() {
		close(stop)
		burners.Wait()
	}
}

// TestInitIsBoundedByFuel loads the count module, whose init does as much
// work as its 100-byte configuration is long, with a unit of fuel per byte:
// initialising an instance takes 104 units (the version call, the buffer
// call, and init's 102), so 4 more units load it and 3 do not.
func TestInitIsBoundedByFuel(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		fuel uint64
		want string // "": loads
	}{
		{"enough", 4, ""},
		{"one unit short", 3, "fuel exhausted: the module did more than 103 units of work"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := pol(t, "count", PhaseRequest, 0, strings.Repeat("x", 100))
			p.Fuel, p.FuelPerInputByte = tc.fuel, 1
			e, err := New(context.Background(), testOptions(t, writeConfig(t, "", Config{Policies: []PolicyConfig{p}})))
			if err == nil {
				e.Close(context.Background())
			}
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("New error = %v, want %q", err, tc.want)
			}
		})
	}
}
