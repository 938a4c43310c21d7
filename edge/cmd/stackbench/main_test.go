package main

import (
	"context"
	"errors"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/edge/cmd/stackbench/plot"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"success", nil, ""},
		{"connect code", connect.NewError(connect.CodeResourceExhausted, errors.New("agent busy")), "resource_exhausted"},
		{"wrapped connect code", fmt.Errorf("call: %w", connect.NewError(connect.CodeUnavailable, errors.New("no agent"))), "unavailable"},
		{"policy unavailable", connect.NewError(connect.CodePermissionDenied, errors.New("denied by policy limits: policy_unavailable")), kindPolicyUnavailable},
		{"failure keeps its kind", &failure{kind: kindExit, msg: "exit 1"}, kindExit},
		{"deadline", context.DeadlineExceeded, "deadline_exceeded"},
		{"no answer", errors.New("connection refused"), kindTransport},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := classify(tc.err); got != tc.want {
				t.Fatalf("classify(%v) = %q, want %q", tc.err, got, tc.want)
			}
		})
	}
}

func TestKindOfText(t *testing.T) {
	t.Parallel()
	for text, want := range map[string]string{
		"resource_exhausted: tenant bench has 16 calls in flight": "resource_exhausted",
		"denied: policy_unavailable (patterns)":                   kindPolicyUnavailable,
		"something odd":                                           kindMCPTool,
	} {
		if got := kindOfText(text, kindMCPTool); got != want {
			t.Errorf("kindOfText(%q) = %q, want %q", text, got, want)
		}
	}
}

func TestRunAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"ok", http.StatusOK, `{"output":"1\n","exitCode":0}`, ""},
		{"program failed", http.StatusOK, `{"output":"","error":"boom","exitCode":1}`, kindExit},
		{"busy", http.StatusServiceUnavailable, `{"error":"no free sandbox"}`, "http_503"},
		{"policy", http.StatusForbidden, `{"error":"policy_unavailable"}`, kindPolicyUnavailable},
		{"not JSON", http.StatusOK, `<html>`, kindTransport},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := classify(runAnswer(tc.status, []byte(tc.body))); got != tc.want {
				t.Fatalf("kind %q, want %q", got, tc.want)
			}
		})
	}
}

func TestMixedJobs(t *testing.T) {
	t.Parallel()
	a, b := mixedJobs(100, 1), mixedJobs(100, 1)
	count := map[string]int{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("job %d differs between two orders of the same seed", i)
		}
		count[a[i].kind]++
	}
	if count[jobEcho.kind] != 70 || count[jobCPU.kind] != 20 || count[jobBusy.kind] != 10 {
		t.Fatalf("mix %v, want 70/20/10", count)
	}
	small := map[string]int{}
	for _, j := range mixedJobs(8, 1) {
		small[j.kind]++
	}
	if small[jobEcho.kind] != 6 || small[jobCPU.kind] != 1 || small[jobBusy.kind] != 1 {
		t.Fatalf("mix of 8 %v, want 6/1/1", small)
	}
	if c := mixedJobs(100, 2); fmt.Sprint(c) == fmt.Sprint(a) {
		t.Fatal("seeds 1 and 2 give the same order")
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	s := summarize([]sample{
		{d: 10 * time.Millisecond}, {d: 20 * time.Millisecond, fail: "resource_exhausted"},
		{d: 30 * time.Millisecond, fail: "resource_exhausted"}, {d: 40 * time.Millisecond, fail: kindExit},
	}, 2*time.Second)
	if s.n != 4 || s.rate != 2 || s.p50 != 20*time.Millisecond || s.p99 != 40*time.Millisecond {
		t.Fatalf("stats %+v", s)
	}
	if got := errText(s.errs); got != "exit_nonzero=1 resource_exhausted=2" {
		t.Fatalf("errors %q", got)
	}
}

// testResults is a run in which the edge's doors are 5% slower than the
// agent, and grpc 50% slower at concurrency 4; CPU is measured at
// concurrency 4 only, 160 ms of the host's per agent run.
func testResults() *results {
	res := &results{stackUp: true, queueWait: 30 * time.Second, start1: 50 * time.Millisecond, start4: 40,
		machine: machine{cpu: "Test CPU", cpus: 2, date: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}}
	for _, conc := range []int{1, 4, 16} {
		base := time.Duration(conc) * 60 * time.Millisecond
		var cpu cpuUse
		if conc == 4 {
			cpu = cpuUse{host: 160 * time.Millisecond, agent: 4 * time.Millisecond, cp: time.Millisecond}
		}
		res.rows = append(res.rows, row{target: "agent", workload: jobPrint.kind, mode: "closed", conc: conc,
			stats: stats{n: 10, p50: base, p95: base * 2, p99: base * 2, rate: 30, errs: map[string]int{}}, cpu: cpu})
		for _, d := range doors {
			p50 := base * 105 / 100
			if d == "grpc" && conc == 4 {
				p50 = base * 3 / 2
			}
			errs := map[string]int{}
			if conc == 16 && d == "run" {
				errs["http_503"] = 1
			}
			if conc == 4 {
				cpu.edge = 2500 * time.Microsecond
			}
			res.rows = append(res.rows, row{target: d, workload: jobPrint.kind, mode: "closed", conc: conc,
				stats: stats{n: 10, p50: p50, p95: p50 * 2, p99: p50 * 2, rate: 20, errs: errs}, cpu: cpu})
		}
	}
	res.rows = append(res.rows, row{target: "mcp+policies", workload: jobPrint.kind, mode: "closed", conc: 16,
		stats: stats{n: 10, p50: time.Second, p95: time.Second, p99: time.Second, errs: map[string]int{kindPolicyUnavailable: 2}}})
	return res
}

func TestChecks(t *testing.T) {
	t.Parallel()
	got := map[string]bool{}
	for _, c := range checks(testResults()) {
		got[c.name] = c.passed
	}
	for name, want := range map[string]bool{
		"connect-json p50 / agent p50, concurrency 1":              true,
		"grpc p50 / agent p50, concurrency 4":                      false,
		"run c16: failures other than resource_exhausted":          false,
		"grpc c16: failures other than resource_exhausted":         true,
		"mcp+policies c16: policy_unavailable failures":            false,
		"agent c4 runs/s / in-sandbox 4-loop python starts/s":      false, // 30 / 40 < 1.5
		"agent c1 closed p50 / in-sandbox python start":            false, // 60 / 50 > 0.5
		"services still running after concurrency 16 (1 = all)":    true,
		"agent c16: p99 (ms) against the agent's queue timeout":    true,
		"mcp+policies c16: failures other than resource_exhausted": false,
	} {
		passed, ok := got[name]
		if !ok {
			t.Errorf("no check %q; have %v", name, got)
			continue
		}
		if passed != want {
			t.Errorf("check %q passed=%v, want %v", name, passed, want)
		}
	}
}

// TestChecksAgainstStarts checks the agent's bounds against interpreter
// starts from both sides.
func TestChecksAgainstStarts(t *testing.T) {
	t.Parallel()
	res := testResults()
	res.start1, res.start4 = 150*time.Millisecond, 15 // 60 ms / 150 ms = 0.4; 30/s / 15/s = 2
	for _, c := range checks(res) {
		switch c.name {
		case "agent c4 runs/s / in-sandbox 4-loop python starts/s", "agent c1 closed p50 / in-sandbox python start":
			if !c.passed {
				t.Errorf("check %q (%.2f) failed", c.name, c.value)
			}
		}
	}
}

func TestReports(t *testing.T) {
	t.Parallel()
	res := testResults()
	text := renderText(res)
	md := renderMarkdown(res, "go run ./edge/cmd/stackbench -n 10", "BENCHMARKS.png")
	for _, want := range []string{"CPU: Test CPU", "p50 ms", "http_503=1", "Targets", "MISSED", "met"} {
		if !strings.Contains(text, want) {
			t.Errorf("text report lacks %q:\n%s", want, text)
		}
		if !strings.Contains(md, want) {
			t.Errorf("Markdown report lacks %q:\n%s", want, md)
		}
	}
	for _, want := range []string{"written by `make bench`", "`go run ./edge/cmd/stackbench -n 10`", "](BENCHMARKS.png)", "| --- |", "2026-01-02T03:04:05Z",
		"## CPU per run", "| agent | python print(1) | closed | 4 | 160.0 | 4.0 | 1.0 | - |", "| grpc | python print(1) | closed | 4 | 160.0 | 4.0 | 1.0 | 2.5 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown report lacks %q:\n%s", want, md)
		}
	}
	// Every line of the results table has as many cells as the header,
	// and only the rows with CPU measured are in the CPU table.
	results, cpu, _ := strings.Cut(md, "## CPU per run")
	if n := strings.Count(cpu, "| closed | 4 |"); n != 1+len(doors) {
		t.Errorf("%d rows in the CPU table, want %d:\n%s", n, 1+len(doors), cpu)
	}
	if strings.Contains(cpu, "| closed | 1 |") {
		t.Errorf("the CPU table has a row that was not measured:\n%s", cpu)
	}
	if !strings.Contains(text, "CPU per run, ms:") {
		t.Errorf("text report lacks the CPU table:\n%s", text)
	}
	rows := 0
	for _, line := range strings.Split(results, "\n") {
		if strings.HasPrefix(line, "| agent | ") || strings.HasPrefix(line, "| grpc | ") {
			if n := strings.Count(line, "|"); n != len(header)+1 {
				t.Errorf("line %q has %d separators, want %d", line, n, len(header)+1)
			}
			rows++
		}
	}
	if rows != 6 {
		t.Errorf("%d agent and grpc rows in the Markdown table, want 6:\n%s", rows, md)
	}
}

func TestPlot(t *testing.T) {
	t.Parallel()
	ss := plotSeries(testResults().rows)
	if len(ss) != 1+len(doors) {
		t.Fatalf("%d series, want agent and %d doors", len(ss), len(doors))
	}
	if s := ss[0]; s.Name != "agent" || len(s.Conc) != 3 || s.P50[2] != 960 {
		t.Fatalf("agent series %+v", s)
	}
	path := filepath.Join(t.TempDir(), "plot.png")
	if err := plot.Write(path, ss, nil); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != plot.W || b.Dy() != plot.H {
		t.Fatalf("image %v, want %dx%d", b, plot.W, plot.H)
	}
	// Something other than the background was drawn in the plot area.
	coloured := 0
	for y := plot.MarginT; y < plot.H-plot.MarginB; y++ {
		for x := plot.MarginL + 1; x < plot.W-plot.MarginR; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			if r != g || g != b {
				coloured++
			}
		}
	}
	if coloured < 100 {
		t.Fatalf("%d coloured pixels in the plot area: no lines drawn", coloured)
	}
}

func TestFlagBounds(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-n", "2"}, {"-warm", "0"}, {"-exec-n", "100000"}, {"-no-such-flag"}, {"-tls-n", "5"}, {"-handshake-n", "0"}, {"-only", "everything"}} {
		var out, errs strings.Builder
		if err := run(t.Context(), args, nil, &out, &errs); err == nil {
			t.Errorf("run %q: no error", args)
		}
		if out.Len() > 0 {
			t.Errorf("run %q printed %q", args, out.String())
		}
	}
}

func TestMerge(t *testing.T) {
	t.Parallel()
	a := &measurement{target: "agent", conc: 4, mode: "closed", samples: []sample{{d: time.Millisecond}}, elapsed: time.Second, cpu: cpuUse{host: time.Second}}
	b := &measurement{target: "agent", conc: 4, mode: "closed", samples: []sample{{d: 2 * time.Millisecond}, {d: 3 * time.Millisecond}}, elapsed: 2 * time.Second, cpu: cpuUse{host: 2 * time.Second}}
	var m *measurement
	m = m.merge(a).merge(b)
	if len(m.samples) != 3 || m.elapsed != 3*time.Second || m.target != "agent" || m.conc != 4 || m.cpu.host != 3*time.Second {
		t.Fatalf("merged %+v", m)
	}
	if len(a.samples) != 1 {
		t.Fatalf("merge changed its receiver: %d samples", len(a.samples))
	}
}

func TestRotation(t *testing.T) {
	t.Parallel()
	const n = 6
	first := map[int]bool{}
	for r := range n {
		order := rotation(n, r)
		if !slices.Equal(slices.Sorted(slices.Values(order)), []int{0, 1, 2, 3, 4, 5}) {
			t.Fatalf("round %d: order %v is not every target once", r, order)
		}
		first[order[0]] = true
	}
	if len(first) != n {
		t.Errorf("over %d rounds, only %v went first", n, first)
	}
}

// workResults is testResults with a realistic workload: the preloaded
// stack meets every bound but print(1)'s paced p50.
func workResults() *results {
	res := testResults()
	for _, it := range workloadItems {
		for _, stack := range []string{stackPreload, stackFresh} {
			for _, step := range workloadSteps {
				p50 := 1000 * time.Millisecond
				rate := 1.0
				cpu := cpuUse{host: 900 * time.Millisecond, sandbox: 800 * time.Millisecond}
				if stack == stackPreload {
					p50, rate = 100*time.Millisecond, 5
					if _, importing := workloadP50Bounds[it.kind]; !importing {
						p50, rate, cpu.sandbox = 1000*time.Millisecond, 1, 840*time.Millisecond
						if step.mode == "paced" && it.kind == jobPrint.kind {
							p50 = 1200 * time.Millisecond
						}
					}
				}
				var lat []time.Duration // 8 runs whose p50 is p50
				for _, f := range []float64{0.8, 0.9, 0.95, 1, 1.05, 1.1, 1.2, 2} {
					lat = append(lat, time.Duration(f*float64(p50)))
				}
				res.work = append(res.work, workRow{row: row{target: stack, workload: it.kind, mode: step.mode, conc: step.conc,
					stats: stats{n: 8, lat: lat, p50: p50, p95: p50 * 2, p99: p50 * 2, rate: rate, errs: map[string]int{}}, cpu: cpu}, load: "1.00"})
			}
		}
	}
	res.memory = []stackMemory{
		{stack: stackPreload, warm: memUse{agentRSS: 40 << 20, sandboxes: 4, sandboxMem: 600 << 20}, after: memUse{agentRSS: 50 << 20, sandboxes: 4, sandboxMem: 700 << 20}},
		{stack: stackFresh, warm: memUse{agentRSS: 40 << 20, sandboxes: 4, sandboxMem: 200 << 20}, after: memUse{agentRSS: 45 << 20, sandboxes: 4, sandboxMem: 220 << 20}},
	}
	return res
}

func TestWorkloadChecks(t *testing.T) {
	t.Parallel()
	got := map[string]check{}
	for _, c := range checks(workResults()) {
		got[c.name] = c
	}
	for name, want := range map[string]bool{
		"pandas: 10,000 rows, groupby, describe: p50 preload / fresh, c1 paced":     true, // 0.1 <= 0.15
		"numpy: 500x500 product, eigenvalues: p50 preload / fresh, c1 closed":       true,
		"matplotlib: line plot, histogram saved: runs/s preload / fresh, c4":        true, // 5 >= 3
		"requests: prepared request: preload p99 / p50, c4":                         true,
		"python print(1): p50 preload / fresh, c1 paced":                            false, // 1.2 > 1.1
		"python print(1): p50 preload / fresh, c1 closed":                           true,
		"javascript console.log(1): sandbox CPU per run preload / fresh, c1 closed": true, // 1.05
		"preload: memory per sandbox after the workload (MiB)":                      true, // 175
		"connect-json p50 / agent p50, concurrency 1":                               true, // the doors' checks stay
	} {
		c, ok := got[name]
		if !ok {
			t.Errorf("no check %q", name)
			continue
		}
		if c.passed != want {
			t.Errorf("check %q (%.2f) passed=%v, want %v", name, c.value, c.passed, want)
		}
	}
	if c := got["pandas: 10,000 rows, groupby, describe: p50 preload / fresh, c1 paced"]; c.bound != 0.15 || c.value != 0.1 {
		t.Errorf("pandas check %+v", c)
	}
	for name, c := range got {
		switch {
		case strings.Contains(name, ": p50 preload / fresh"):
			if !(0 < c.lo && c.lo < c.value && c.value < c.hi) {
				t.Errorf("check %q: value %.2f outside its interval %.2f-%.2f", name, c.value, c.lo, c.hi)
			}
		case c.hi != 0:
			t.Errorf("check %q has an interval; only p50 ratios have one", name)
		}
	}
	// Without the fresh stack's rows there is nothing to compare.
	res := workResults()
	res.work = slices.DeleteFunc(res.work, func(r workRow) bool { return r.target == stackFresh })
	for _, c := range checks(res) {
		if strings.Contains(c.name, "preload / fresh") {
			t.Errorf("check %q without a fresh stack", c.name)
		}
	}
}

func TestP50RatioInterval(t *testing.T) {
	t.Parallel()
	ms := func(fs ...float64) []time.Duration {
		var d []time.Duration
		for _, f := range fs {
			d = append(d, time.Duration(f*float64(time.Millisecond)))
		}
		return d
	}
	if lo, hi := p50RatioInterval(ms(20, 20, 20), ms(10, 10)); lo != 2 || hi != 2 {
		t.Errorf("runs that never vary: interval %.2f-%.2f, want 2-2", lo, hi)
	}
	if lo, hi := p50RatioInterval(ms(20), ms(10, 10)); lo != 0 || hi != 0 {
		t.Errorf("one run: interval %.2f-%.2f, want none", lo, hi)
	}
	// Runs spread over 30-90 ms, as in a closed loop whose runs find a
	// free CPU or wait for a scrub: the interval is wide, and narrows with
	// more runs.
	spread := func(n int) []time.Duration {
		var d []time.Duration
		for i := range n {
			d = append(d, ms(30+float64(i*37%61))...)
		}
		return d
	}
	lo36, hi36 := p50RatioInterval(spread(36), spread(36))
	lo360, hi360 := p50RatioInterval(spread(360), spread(360))
	if !(lo36 < 0.9 && hi36 > 1.1) {
		t.Errorf("36 runs of 30-90 ms: interval %.2f-%.2f, want wider than 0.9-1.1", lo36, hi36)
	}
	if !(lo36 < lo360 && lo360 < 1 && 1 < hi360 && hi360 < hi36) || hi360-lo360 > (hi36-lo36)/2 {
		t.Errorf("interval %.2f-%.2f from 360 runs, %.2f-%.2f from 36: want it half as wide or less, around 1", lo360, hi360, lo36, hi36)
	}
	t.Logf("36 runs: %.2f-%.2f; 360 runs: %.2f-%.2f", lo36, hi36, lo360, hi360)
	if lo, hi := p50RatioInterval(spread(36), spread(36)); lo != lo36 || hi != hi36 {
		t.Errorf("the same runs gave %.2f-%.2f, then %.2f-%.2f", lo36, hi36, lo, hi)
	}
}

func TestWorkloadReports(t *testing.T) {
	t.Parallel()
	res := workResults()
	text := renderText(res)
	md := renderMarkdown(res, "go run ./edge/cmd/stackbench", "BENCHMARKS.png")
	if !strings.Contains(md, "| measure | value | 90% interval | bound | verdict |") || !strings.Contains(md, "90% interval: of a p50 ratio") {
		t.Errorf("the Targets lack the interval's column or legend:\n%s", md)
	}
	for _, want := range []string{"pandas: 10,000 rows, groupby, describe", "sandbox CPU/run ms", "agent RSS MiB (warm / after)", "150 / 175", "40 / 50"} {
		if !strings.Contains(text, want) || !strings.Contains(md, want) {
			t.Errorf("reports lack %q:\n%s", want, md)
		}
	}
	if !strings.Contains(md, "## Realistic workload") {
		t.Errorf("markdown lacks the workload section:\n%s", md)
	}
	// Only the workload: no empty table of the doors.
	res.rows = nil
	if md := renderMarkdown(res, "go run ./edge/cmd/stackbench -only workload", ""); strings.Contains(md, "## Results") || strings.Contains(md, "services still running") {
		t.Errorf("a workload-only report has the doors' parts:\n%s", md)
	}
}

func TestWorkloadPlot(t *testing.T) {
	t.Parallel()
	ws := workloadBars(workResults().work)
	if len(ws) != len(workloadItems) || ws[0].PreloadClosed != 1000 || ws[2].PreloadPaced != 100 || ws[2].FreshClosed != 1000 {
		t.Fatalf("bars %+v", ws)
	}
	for _, tc := range []struct {
		name   string
		ss     []plot.Series
		panels int
	}{{"doors and workload", plotSeries(testResults().rows), 2}, {"workload only", nil, 1}} {
		path := filepath.Join(t.TempDir(), "plot.png")
		if err := plot.Write(path, tc.ss, ws); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if b := img.Bounds(); b.Dx() != plot.W || b.Dy() != tc.panels*plot.H {
			t.Fatalf("%s: image %v, want %dx%d", tc.name, b, plot.W, tc.panels*plot.H)
		}
		// The bars' panel is the last: some bar was drawn in it.
		coloured := 0
		for y := (tc.panels-1)*plot.H + plot.MarginT; y < tc.panels*plot.H-plot.MarginB; y++ {
			for x := plot.MarginL + 1; x < plot.W-plot.MarginR; x++ {
				r, g, b, _ := img.At(x, y).RGBA()
				if r != g || g != b {
					coloured++
				}
			}
		}
		if coloured < 100 {
			t.Fatalf("%s: %d coloured pixels in the bars' panel", tc.name, coloured)
		}
	}
}

func TestResultFailure(t *testing.T) {
	t.Parallel()
	png := &executionv1.Artifact{Name: "plot.png", Content: []byte("\x89PNG"), Size: 4}
	withArtifact := job{kind: "plot", language: "python", code: "...", artifact: "plot.png"}
	for _, tc := range []struct {
		name string
		res  *executionv1.Result
		j    job
		want string
	}{
		{"exit 0", &executionv1.Result{}, jobPrint, ""},
		{"exit 1", &executionv1.Result{ExitCode: 1, Stderr: "boom"}, jobPrint, kindExit},
		{"artifact returned", &executionv1.Result{Artifacts: []*executionv1.Artifact{png}}, withArtifact, ""},
		{"no artifact", &executionv1.Result{}, withArtifact, kindArtifact},
		{"another artifact", &executionv1.Result{Artifacts: []*executionv1.Artifact{{Name: "other.png", Content: []byte("x"), Size: 1}}}, withArtifact, kindArtifact},
		{"artifact empty", &executionv1.Result{Artifacts: []*executionv1.Artifact{{Name: "plot.png"}}}, withArtifact, kindArtifact},
		{"artifact cut short", &executionv1.Result{Artifacts: []*executionv1.Artifact{{Name: "plot.png", Content: []byte("\x89P"), Size: 4}}}, withArtifact, kindArtifact},
		{"exit 1 before the artifact", &executionv1.Result{ExitCode: 1}, withArtifact, kindExit},
	} {
		if got := classify(resultFailure(tc.res, tc.j)); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestSandboxDelta(t *testing.T) {
	t.Parallel()
	before := map[string]time.Duration{"a": 100, "b": 50, "gone": 70}
	after := map[string]time.Duration{"a": 130, "b": 50, "new": 40}
	if got := sandboxDelta(before, after); got != 70 {
		t.Fatalf("sandboxDelta = %v, want 70 (30 of a, 40 of the new one)", got)
	}
}

// TestMeterReadsWhenQuiet checks that both readings of a metered target
// come after its quiet wait: what the agent still does for the runs
// before the meter starts is not counted, and what it does after the
// runs' last answer (the last scrub) is.
func TestMeterReadsWhenQuiet(t *testing.T) {
	t.Parallel()
	var events []string
	tg := target{
		cpu:       func() cpuUse { events = append(events, "cpu"); return cpuUse{} },
		sandboxes: func() map[string]time.Duration { events = append(events, "sandboxes"); return nil },
		quiet:     func() { events = append(events, "quiet") },
	}
	read := tg.startMeter()
	events = append(events, "runs")
	read()
	want := []string{"quiet", "cpu", "sandboxes", "runs", "quiet", "cpu", "sandboxes"}
	if !slices.Equal(events, want) {
		t.Fatalf("events %v, want %v", events, want)
	}
}

// gateCaller is a caller whose calls each wait until n calls are under way
// at once, or until their context ends.
type gateCaller struct {
	n       int
	mu      *sync.Mutex
	cond    *sync.Cond
	inCall  *int
	maxSeen *int
	closed  *int
}

func (c gateCaller) call(ctx context.Context, j job) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	*c.inCall++
	*c.maxSeen = max(*c.maxSeen, *c.inCall)
	c.cond.Broadcast()
	stop := context.AfterFunc(ctx, func() { c.mu.Lock(); c.cond.Broadcast(); c.mu.Unlock() })
	defer stop()
	for *c.maxSeen < c.n && ctx.Err() == nil {
		c.cond.Wait()
	}
	*c.inCall--
	return nil
}

func (c gateCaller) close() { c.mu.Lock(); *c.closed++; c.mu.Unlock() }

// TestSpread checks that spread's calls are under way at once (each call
// here returns only once all are), on callers of their own, all closed
// after.
func TestSpread(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex
	var inCall, maxSeen, closed, dialled int
	c := gateCaller{n: 3, mu: &mu, cond: sync.NewCond(&mu), inCall: &inCall, maxSeen: &maxSeen, closed: &closed}
	tg := target{name: "t", dial: func(context.Context) (caller, error) { dialled++; return c, nil }}
	if err := spread(ctx, tg, 3, jobPrint); err != nil {
		t.Fatal(err)
	}
	if maxSeen != 3 || dialled != 3 || closed != 3 {
		t.Fatalf("calls at once %d, dialled %d, closed %d; want 3 of each", maxSeen, dialled, closed)
	}
}
