package policy

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/tetratelabs/wazero"
	"google.golang.org/protobuf/proto"
)

// Run: go test -run '^$' -bench . -benchtime 2000x ./edge/internal/policy/
// (compile benchmarks take seconds per iteration: add -bench 'Call|Chain|Instantiate'
// to skip them).

var benchModules = []string{"tenantblock", "handcodec", "protocodec", "languages", "patterns", "redact"}

func benchPhase(name string) string {
	if name == "redact" {
		return PhaseResult
	}
	return PhaseRequest
}

func benchConfig(name string) string {
	switch name {
	case "tenantblock":
		return "mallory"
	case "languages":
		return "acme: python, bash\n*: python"
	}
	return ""
}

type benchCase struct {
	label, name      string
	contextInterrupt bool
}

func benchCases() []benchCase {
	var cs []benchCase
	for _, n := range benchModules {
		cs = append(cs, benchCase{n, n, false})
	}
	for _, n := range benchModules {
		cs = append(cs, benchCase{n + "/context", n, true})
	}
	return cs
}

// BenchmarkCompile compiles a module with no cache, as the first load does.
func BenchmarkCompile(b *testing.B) {
	for _, name := range benchModules {
		b.Run(name, func(b *testing.B) {
			code, err := os.ReadFile(policytest.Build(b).Path(b, name))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(len(code)), "module-bytes")
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler())
				if _, err := rt.CompileModule(ctx, code); err != nil {
					b.Fatal(err)
				}
				rt.Close(ctx)
			}
		})
	}
}

// loadForBench loads one module with a pool of one.
func loadForBench(b *testing.B, name string, contextInterrupt bool) *module {
	b.Helper()
	p := pol(b, name, benchPhase(name), 0, benchConfig(name))
	p.PoolSize = 1
	cfg := Config{Policies: []PolicyConfig{p}}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	cache, err := wazero.NewCompilationCacheWithDir(policytest.CacheDir(b))
	if err != nil {
		b.Fatal(err)
	}
	m, err := loadModule(context.Background(), cfg.Policies[0], "", cache, discardLogger(), contextInterrupt)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.close(context.Background()); cache.Close(context.Background()) })
	return m
}

// BenchmarkInstantiate makes one instance of a compiled module: start
// functions, version check and init, as a pool refill does.
func BenchmarkInstantiate(b *testing.B) {
	for _, name := range benchModules {
		b.Run(name, func(b *testing.B) {
			m := loadForBench(b, name, false)
			ctx := context.Background()
			b.ReportAllocs()
			var pages uint32
			for b.Loop() {
				inst, err := m.instantiate(ctx)
				if err != nil {
					b.Fatal(err)
				}
				pages = inst.mem.Size() / 65536
				inst.mod.Close(ctx)
			}
			b.ReportMetric(float64(pages)*64, "KiB-memory")
		})
	}
}

func benchInput(b *testing.B, name string) []byte {
	var msg proto.Message = &policyv1.RequestInput{
		Execution: &executionv1.Execution{Language: "python", Code: "print(1)"},
		Tenant:    "acme", Door: "connect", RequestId: "req-1",
	}
	if benchPhase(name) == PhaseResult {
		msg = &policyv1.ResultInput{Result: &executionv1.Result{Stdout: "1\n"}, Tenant: "acme", Door: "connect", RequestId: "req-1", Language: "python"}
	}
	in, err := proto.Marshal(msg)
	if err != nil {
		b.Fatal(err)
	}
	return in
}

// BenchmarkCall is one guest call on a pooled instance: write the input,
// call the export under a deadline, read the answer (not decoded).
//
// The "context" variants use wazero's WithCloseOnContextDone instead of the
// instrumented interrupt check (see RATIONALE.md).
func BenchmarkCall(b *testing.B) {
	for _, bc := range benchCases() {
		name := bc.name
		b.Run(bc.label, func(b *testing.B) {
			m := loadForBench(b, name, bc.contextInterrupt)
			in := benchInput(b, name)
			ctx := context.Background()
			n := 0
			decode := func(d []byte) error { n = len(d); return nil }
			b.ReportAllocs()
			cpu0, n0 := processCPU(), 0
			for b.Loop() {
				if err := m.call(ctx, in, decode); err != nil {
					b.Fatal(err)
				}
				n0++
			}
			b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(n0), "cpu-ns/op")
			if n == 0 {
				b.Fatal("empty answer")
			}
		})
	}
}

// BenchmarkCallCancellable is BenchmarkCall of the smallest module with a
// context that can be cancelled, as every request's is: the difference is
// the cost of registering each call for the cancel that interrupts it.
func BenchmarkCallCancellable(b *testing.B) {
	m := loadForBench(b, "tenantblock", false)
	in := benchInput(b, "tenantblock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	decode := func([]byte) error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		if err := m.call(ctx, in, decode); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEvaluate is EvaluateRequest (or EvaluateResult) with one policy:
// the call plus encoding the input, decoding and validating the decision.
func BenchmarkEvaluate(b *testing.B) {
	for _, name := range benchModules {
		b.Run(name, func(b *testing.B) {
			p := pol(b, name, benchPhase(name), 0, benchConfig(name))
			e := newEngine(b, Config{Policies: []PolicyConfig{p}})
			ctx := context.Background()
			in := req("acme", "python", "print(1)")
			rin := ResultInput{Result: &executionv1.Result{Stdout: "1\n"}, Tenant: "acme", Door: "connect", RequestID: "r", Language: "python"}
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if p.Phase == PhaseResult {
					_, err = e.EvaluateResult(ctx, rin)
				} else {
					_, err = e.EvaluateRequest(ctx, in)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// exampleChain is every Go example: five request policies and the redaction.
func exampleChain(t testing.TB) Config {
	return Config{
		Labels: map[string][]string{"pool": {"acme", "node"}},
		Policies: []PolicyConfig{
			pol(t, "languages", PhaseRequest, 10, "acme: python, bash\n*: python"),
			pol(t, "patterns", PhaseRequest, 20, ""),
			pol(t, "prelude", PhaseRequest, 30, "import sys; sys.setrecursionlimit(200)"),
			pol(t, "limits", PhaseRequest, 40, "acme: 60s\n*: 5s"),
			pol(t, "routes", PhaseRequest, 50, "tenant acme: pool=acme\nlanguage javascript: pool=node"),
			pol(t, "redact", PhaseResult, 10, ""),
		},
	}
}

// BenchmarkChain is the per-request overhead of the whole chain of Go
// examples on pooled instances, request phase plus result phase, with its
// percentiles.
func BenchmarkChain(b *testing.B) {
	for _, tc := range []struct {
		name             string
		code             string
		contextInterrupt bool
	}{
		{"print", "print(1)", false},
		{"4KiB", strings.Repeat("x = 1\n", 4096/6), false},
		{"print/context", "print(1)", true},
		{"4KiB/context", strings.Repeat("x = 1\n", 4096/6), true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e := newEngineWith(b, exampleChain(b), tc.contextInterrupt)
			// Cancellable, as every request's context is: each call
			// then registers for the cancel that interrupts it.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			in := req("acme", "python", tc.code)
			res := &executionv1.Result{Stdout: "1\nAKIAIOSFODNN7EXAMPLE\n" + strings.Repeat("output line\n", 20)}
			var lat []time.Duration
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				start := time.Now()
				v, err := e.EvaluateRequest(ctx, in)
				if err != nil {
					b.Fatal(err)
				}
				r, err := e.EvaluateResult(ctx, ResultInput{Result: res, Tenant: in.Tenant, Door: in.Door,
					RequestID: in.RequestID, Language: v.Execution.Language, Annotations: v.Annotations})
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				if v.Route["pool"] != "acme" || strings.Contains(r.Result.Stdout, "AKIA") {
					b.Fatalf("chain did not route or redact: %v %q", v.Route, r.Result.Stdout)
				}
			}
			b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(len(lat)), "cpu-ns/op")
			testkit.ReportPercentiles(b, lat, time.Nanosecond)
		})
	}
}

// BenchmarkChainParallel runs the chain from GOMAXPROCS goroutines at once.
func BenchmarkChainParallel(b *testing.B) {
	e := newEngine(b, exampleChain(b))
	in := req("acme", "python", "print(1)")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := e.EvaluateRequest(context.Background(), in); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
