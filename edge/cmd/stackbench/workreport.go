package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/codemode-go/codemode/internal/testkit/benchbase"
)

// Bounds of the realistic workload, preloaded stack against fresh.
var (
	// workloadP50Bounds are each importing item's p50 ratio at
	// concurrency 1, paced and closed.
	workloadP50Bounds = map[string]float64{
		"requests: prepared request":             0.3,
		"numpy: 500x500 product, eigenvalues":    0.3,
		"pandas: 10,000 rows, groupby, describe": 0.15,
		"matplotlib: line plot, histogram saved": 0.25,
	}
	// workloadNoRegression are the items that import nothing: p50 and
	// CPU per run within noRegression of the fresh stack's.
	workloadNoRegression = []string{"python print(1)", "javascript console.log(1)"}
)

const (
	noRegression    = 1.1 // p50 and CPU per run of code that imports nothing, preload / fresh
	workloadRateC4  = 3.0 // runs/s at concurrency 4 of the importing items, preload / fresh
	sandboxMemLimit = 512 // MiB: the agent's default sandbox memory limit
)

// findWork returns the workload row of item on stack in mode at conc.
func findWork(res *results, item, stack, mode string, conc int) (workRow, bool) {
	for _, r := range res.work {
		if r.workload == item && r.target == stack && r.mode == mode && r.conc == conc {
			return r, true
		}
	}
	return workRow{}, false
}

// workloadChecks are the Targets of the realistic workload; a check whose
// rows are missing is left out.
func workloadChecks(res *results) []check {
	var cs []check
	pair := func(item, mode string, conc int) (p, f workRow, ok bool) {
		p, ok1 := findWork(res, item, stackPreload, mode, conc)
		f, ok2 := findWork(res, item, stackFresh, mode, conc)
		return p, f, ok1 && ok2 && f.p50 > 0 && p.p50 > 0
	}
	for _, it := range workloadItems {
		bound, importing := workloadP50Bounds[it.kind]
		if !importing {
			continue
		}
		for _, mode := range []string{"paced", "closed"} {
			if p, f, ok := pair(it.kind, mode, 1); ok {
				cs = append(cs, p50Check(fmt.Sprintf("%s: p50 preload / fresh, c1 %s", it.kind, mode), p, f, bound))
			}
		}
		if p, f, ok := pair(it.kind, "closed", 4); ok && f.rate > 0 {
			cs = append(cs,
				newCheck(it.kind+": runs/s preload / fresh, c4", p.rate/f.rate, ">=", workloadRateC4, "x"),
				newCheck(it.kind+": preload p99 / p50, c4", float64(p.p99)/float64(p.p50), "<=", tailOverMedian, "x"))
		}
	}
	for _, item := range workloadNoRegression {
		for _, mode := range []string{"paced", "closed"} {
			if p, f, ok := pair(item, mode, 1); ok {
				cs = append(cs, p50Check(fmt.Sprintf("%s: p50 preload / fresh, c1 %s", item, mode), p, f, noRegression))
			}
		}
		if p, f, ok := pair(item, "closed", 1); ok && f.cpu.sandbox > 0 {
			cs = append(cs, newCheck(item+": sandbox CPU per run preload / fresh, c1 closed", float64(p.cpu.sandbox)/float64(f.cpu.sandbox), "<=", noRegression, "x"))
		}
	}
	for _, m := range res.memory {
		if m.stack == stackPreload && m.after.sandboxes > 0 {
			cs = append(cs, newCheck("preload: memory per sandbox after the workload (MiB)", mib(m.after.sandboxMem)/float64(m.after.sandboxes), "<=", sandboxMemLimit, ""))
		}
	}
	return cs
}

// p50Check is the check that p's p50 is at most bound times f's, with the
// ratio's 90% interval from their runs.
func p50Check(name string, p, f workRow, bound float64) check {
	c := newCheck(name, float64(p.p50)/float64(f.p50), "<=", bound, "x")
	c.lo, c.hi = p50RatioInterval(p.lat, f.lat)
	return c
}

// bootstrapResamples is how many resamples p50RatioInterval draws.
const bootstrapResamples = 2000

// p50RatioInterval returns a 90% interval of p50(a) / p50(b), the 5th and
// 95th percentiles of the ratio over bootstrapResamples resamples (each
// of a and b drawn again, as many runs, with replacement): how far the
// runs measured bound the ratio, had they been other runs alike. It says
// nothing of what changes between runs of the benchmark (the host's load,
// a slow CPU). 0, 0 if either has fewer than two runs. The draws are
// seeded, so the same runs give the same interval.
func p50RatioInterval(a, b []time.Duration) (lo, hi float64) {
	if len(a) < 2 || len(b) < 2 {
		return 0, 0
	}
	rng := rand.New(rand.NewPCG(1, 2))
	draw := func(dst, src []time.Duration) time.Duration {
		for i := range dst {
			dst[i] = src[rng.IntN(len(src))]
		}
		return benchbase.Percentile(dst, 50)
	}
	ra, rb := make([]time.Duration, len(a)), make([]time.Duration, len(b))
	ratios := make([]float64, 0, bootstrapResamples)
	for range bootstrapResamples {
		pa, pb := draw(ra, a), draw(rb, b)
		if pb > 0 {
			ratios = append(ratios, float64(pa)/float64(pb))
		}
	}
	if len(ratios) == 0 {
		return 0, 0
	}
	slices.Sort(ratios)
	return ratios[len(ratios)*5/100], ratios[(len(ratios)*95-1)/100]
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

var workHeader = []string{"item", "stack", "mode", "conc", "n", "p50 ms", "p95 ms", "p99 ms", "runs/s", "host CPU/run ms", "sandbox CPU/run ms", "agent CPU/run ms", "new sandboxes", "errors", "load (1 min)", "CPU sets' spread"}

// workCells is the workload's table as text.
func workCells(rows []workRow) [][]string {
	out := [][]string{workHeader}
	f := func(d time.Duration) string { return fmt.Sprintf("%.1f", ms(d)) }
	for _, r := range rows {
		out = append(out, []string{r.workload, r.target, r.mode, fmt.Sprint(r.conc), fmt.Sprint(r.n), f(r.p50), f(r.p95), f(r.p99),
			fmt.Sprintf("%.2f", r.rate), f(r.cpu.host), f(r.cpu.sandbox), f(r.cpu.agent), fmt.Sprint(r.newSandboxes), errText(r.errs), r.load, r.cpuSpread})
	}
	return out
}

var memHeader = []string{"stack", "agent RSS MiB (warm / after)", "sandboxes (warm / after)", "sandboxes' memory MiB (warm / after)", "per sandbox MiB (warm / after)", "load at warm"}

// memCells is the memory table as text.
func memCells(ms []stackMemory) [][]string {
	out := [][]string{memHeader}
	per := func(u memUse) string {
		if u.sandboxes == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", mib(u.sandboxMem)/float64(u.sandboxes))
	}
	for _, m := range ms {
		out = append(out, []string{m.stack,
			fmt.Sprintf("%.0f / %.0f", mib(m.warm.agentRSS), mib(m.after.agentRSS)),
			fmt.Sprintf("%d / %d", m.warm.sandboxes, m.after.sandboxes),
			fmt.Sprintf("%.0f / %.0f", mib(m.warm.sandboxMem), mib(m.after.sandboxMem)),
			per(m.warm) + " / " + per(m.after), m.loadWarm})
	}
	return out
}

const workLegend = `
Each item stateless through the Connect JSON door of an edge: preload, the stack whose agent
has --preload=default; fresh, a second stack whose agent has --preload= (each run's
interpreter started fresh), measured in turns with it. paced: one run every 500 ms, each
turn after as many runs at once as the agent has CPU sets, so that a sandbox on each holds
the item's interpreter; closed: each worker starts its next run when its last one ends.
CPU is read with both stacks' agents quiet (no run, scrub or sandbox start under way) before
and after each turn, so a row holds its runs' scrubs, the last one's included, and nothing
of the row before or of the other stack's. host CPU: the whole host's
busy time per run (other tenants included); sandbox CPU: the agent's sandboxes' cgroups (their gVisor
kernels and everything in them, a replaced sandbox's start included); agent CPU: the agent
process's own; new sandboxes: those the agent started during the row's runs (replacing one
that served its runs (at most --max-reuse), or growing its pool). The matplotlib item fails (artifact_missing) unless its figure comes back as
an artifact. load: the 1-minute load average when the row was measured. CPU sets' spread: the
CPU time a fixed loop took on the slowest CPU set the preloaded stack's agent pins sandboxes to,
over the fastest one's, as it last measured them (every 2 s at most) when the row ended; a virtual
machine's CPUs do not always deliver alike, and a run pinned to a slow one is that much slower.
`

const memLegend = `
agent RSS: the agent process's resident set (/proc/PID/status); sandboxes' memory: their
cgroups' memory.usage_in_bytes, what their memory limit applies to; warm: before the
workload, after: once it ended.
`

// writeWorkText writes the workload's part of the text report.
func writeWorkText(b *strings.Builder, res *results) {
	if len(res.work) == 0 {
		return
	}
	b.WriteString("\nRealistic workload, preloaded against fresh interpreters:\n")
	writeText(b, workCells(res.work), func(i int) bool { return i < 3 || i >= len(workHeader)-2 })
	b.WriteString(workLegend)
	if len(res.memory) > 0 {
		b.WriteString("\nMemory:\n")
		writeText(b, memCells(res.memory), func(i int) bool { return i == 0 })
		b.WriteString(memLegend)
	}
}

// writeWorkMarkdown writes the workload's part of BENCHMARKS.md.
func writeWorkMarkdown(b *strings.Builder, res *results) {
	if len(res.work) == 0 {
		return
	}
	b.WriteString("\n## Realistic workload\n\nThe code models send, preloaded against fresh interpreters.\n\n")
	writeMarkdown(b, workCells(res.work))
	b.WriteString(workLegend)
	if len(res.memory) > 0 {
		b.WriteString("\n### Memory\n\n")
		writeMarkdown(b, memCells(res.memory))
		b.WriteString(memLegend)
	}
}
