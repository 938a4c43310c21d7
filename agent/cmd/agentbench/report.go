package main

import (
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/codemode-go/codemode/internal/testkit/benchbase"
)

// runs is what a series of runs measured: the latency of each, and the wall
// time of the whole series (0 when the runs were timed one by one, with
// nothing between them).
type runs struct {
	lat     []time.Duration
	elapsed time.Duration
}

// p returns the latency at percentile pct.
func (r runs) p(pct int) time.Duration { return benchbase.Percentile(r.lat, pct) }

func (r runs) p50() time.Duration { return r.p(50) }

// rate is runs per second: over the wall time of the series, or over the
// sum of the latencies when there is none.
func (r runs) rate() float64 {
	d := r.elapsed
	if d == 0 {
		for _, l := range r.lat {
			d += l
		}
	}
	return float64(len(r.lat)) / d.Seconds()
}

// paced is one stateless run every pace, in Python and in JavaScript.
type paced struct{ python, javascript runs }

// report is everything one run of agentbench measured.
type report struct {
	o options

	// Baselines, in one warm runsc container from the same image.
	exec   runs          // docker exec python3 -c 'print(1)' through the Engine API
	start1 time.Duration // one python3 start inside the sandbox, one loop of starts
	start4 time.Duration // wall time of four loops in parallel over the starts of one

	// The runner in one sandbox: each run and the scrub after it.
	split []splitRow

	// The agent measured, with o.warm warm sandboxes.
	rss              int64  // the agent's resident memory, bytes, once warm
	python1, python4 runs   // stateless print(1), concurrency 1 and 4
	bash1, bash4     runs   // stateless echo 1, concurrency 1 and 4
	cpu              cpuUse // per stateless python run at concurrency 4
	stateful         runs   // x = 1 in one session
	paced            paced

	// Stateless print(1) at concurrency 4, in turns: the agent, and a
	// second one started with --run-slots 0.
	slotted4, unbounded4 runs

	// A second agent, started with --prestart=false.
	coldPython1 runs // stateless print(1), concurrency 1
	coldPaced   paced
}

// rate4 is the interpreter starts per second of four loops in parallel
// inside the sandbox.
func (r *report) rate4() float64 { return 4 * float64(time.Second) / float64(r.start4) }

// target is one acceptance bound on a figure of the report.
type target struct {
	name          string
	value         func(*report) float64
	bound         float64
	lowerIsBetter bool
	unit          string // "x" for a ratio
}

// targets are the bounds agentbench checks, ratios of one run where there
// is a baseline to divide by. The in-sandbox interpreter start is one
// python3 start in a loop of them inside a warm runsc sandbox (start1); the
// 4-loop start rate is the starts per second of four such loops in
// parallel.
func targets(o options) []target {
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(b) }
	return []target{
		{"agent stateless python p50 / docker exec p50",
			func(r *report) float64 { return ratio(r.python1.p50(), r.exec.p50()) }, 0.6, true, "x"},
		{"agent stateless python p50, closed loop at concurrency 1 / in-sandbox interpreter start",
			func(r *report) float64 { return ratio(r.python1.p50(), r.start1) }, 0.5, true, "x"},
		{fmt.Sprintf("agent stateless python p50, paced (one run every %v) / in-sandbox interpreter start", pace),
			func(r *report) float64 { return ratio(r.paced.python.p50(), r.start1) }, 0.4, true, "x"},
		{"agent stateless python throughput at concurrency 4 / in-sandbox 4-loop start rate",
			func(r *report) float64 { return r.python4.rate() / r.rate4() }, 1.5, false, "x"},
		{"agent stateless python p99 / p50 at concurrency 4",
			func(r *report) float64 { return ratio(r.python4.p(99), r.python4.p50()) }, 3, true, "x"},
		{"stateful-session trivial statement p50 (ms)",
			func(r *report) float64 { return ms(r.stateful.p50()) }, 20, true, ""},
		{fmt.Sprintf("agent RSS with %d warm sandboxes (MB)", o.warm),
			func(r *report) float64 { return float64(r.rss) / (1 << 20) }, 64, true, ""},
	}
}

// row is one line of the table of measurements.
type row struct {
	name       string
	conc, n    int
	p50        time.Duration
	p95, p99   time.Duration
	rate       float64 // per second
	noPercents bool    // only p50 (if not 0) and the rate are known
}

func rowOf(name string, conc int, r runs) row {
	return row{name: name, conc: conc, n: len(r.lat), p50: r.p50(), p95: r.p(95), p99: r.p(99), rate: r.rate()}
}

// rows are the report's measurements as the lines of a table.
func (r *report) rows() []row {
	pacedRows := func(p paced, suffix string) []row {
		return []row{
			rowOf(fmt.Sprintf("agent stateless python print(1), one every %v%s", pace, suffix), 1, p.python),
			rowOf(fmt.Sprintf("agent stateless javascript console.log(1), one every %v%s", pace, suffix), 1, p.javascript),
		}
	}
	rows := []row{
		rowOf("docker exec python3 -c 'print(1)' (Engine API, warm runsc)", 1, r.exec),
		{name: "python3 start inside a runsc sandbox, 1 loop", conc: 1, n: r.o.loopN, p50: r.start1,
			rate: float64(time.Second) / float64(r.start1), noPercents: true},
		{name: "python3 start inside a runsc sandbox, 4 loops", conc: 4, n: 4 * r.o.loopN, rate: r.rate4(), noPercents: true},
		rowOf("agent stateless python print(1)", 1, r.python1),
		rowOf("agent stateless python print(1)", 4, r.python4),
		rowOf("agent stateless bash echo 1", 1, r.bash1),
		rowOf("agent stateless bash echo 1", 4, r.bash4),
		rowOf("agent stateful session: x = 1", 1, r.stateful),
	}
	rows = append(rows, pacedRows(r.paced, "")...)
	rows = append(rows, rowOf("agent stateless python print(1), run slots, in turns", 4, r.slotted4),
		rowOf("agent stateless python print(1), --run-slots 0, in turns", 4, r.unbounded4))
	rows = append(rows, rowOf("agent stateless python print(1), --prestart=false", 1, r.coldPython1))
	return append(rows, pacedRows(r.coldPaced, ", --prestart=false")...)
}

// print writes the table, the runner's split, the CPU use, what prestarting
// saves and the targets, each marked met or MISSED.
func (r *report) print(w io.Writer) {
	r.printTable(w)
	for _, s := range r.split {
		mem := ""
		if s.memory > 0 {
			mem = fmt.Sprintf(", sandbox memory after it %.1f MiB", float64(s.memory)/(1<<20))
		}
		fmt.Fprintf(w, "runner in one sandbox, %s: wall %.1f ms, sandbox CPU %.1f ms%s\n", s.what, ms(s.wall), ms(s.cpu), mem)
	}
	if r.cpu.sandboxes > 0 {
		fmt.Fprintf(w, "\nCPU per stateless python run at concurrency 4: sandboxes (runner run + scrub, under runsc) %.1f ms, agent %.1f ms, dockerd+containerd %.1f ms; the whole host %.1f ms\n",
			ms(r.cpu.sandboxes), ms(r.cpu.agent), ms(r.cpu.engine), ms(r.cpu.host))
	}
	fmt.Fprintf(w, "\nPrestarted interpreters: stateless python p50 %.1f ms against %.1f ms without (%.2fx)\n",
		ms(r.python1.p50()), ms(r.coldPython1.p50()), float64(r.python1.p50())/float64(r.coldPython1.p50()))
	for _, l := range []struct {
		lang       string
		warm, cold runs
	}{{"python", r.paced.python, r.coldPaced.python}, {"javascript", r.paced.javascript, r.coldPaced.javascript}} {
		fmt.Fprintf(w, "  one %s run every %v: p50 %.1f ms against %.1f ms without (%.2fx)\n",
			l.lang, pace, ms(l.warm.p50()), ms(l.cold.p50()), float64(l.warm.p50())/float64(l.cold.p50()))
	}

	if len(r.unbounded4.lat) > 0 {
		fmt.Fprintf(w, "\nRun slots (%d, the host's CPUs), stateless python at concurrency 4, in turns: %.1f runs/s against %.1f without (%.2fx), p99 %.0f ms against %.0f ms (%.2fx)\n",
			runtime.NumCPU(), r.slotted4.rate(), r.unbounded4.rate(), r.slotted4.rate()/r.unbounded4.rate(),
			ms(r.slotted4.p(99)), ms(r.unbounded4.p(99)), float64(r.slotted4.p(99))/float64(r.unbounded4.p(99)))
	}
	fmt.Fprintf(w, "\nTargets (ratios of this run):\n")
	ts := targets(r.o)
	width := 0
	for _, t := range ts {
		width = max(width, len(t.name))
	}
	for _, t := range ts {
		v := t.value(r)
		op, ok := "<=", v <= t.bound
		if !t.lowerIsBetter {
			op, ok = ">=", v >= t.bound
		}
		verdict := "met"
		if !ok {
			verdict = "MISSED"
		}
		fmt.Fprintf(w, "  %-*s %8.2f%s  target %s %.2f%s  %s\n", width, t.name, v, t.unit, op, t.bound, t.unit, verdict)
	}
}

func (r *report) printTable(w io.Writer) {
	fmt.Fprintf(w, "\nruntime %s, image %s, %.2g CPUs per sandbox (agent and baseline alike), host CPUs %d\n", r.o.runtime, r.o.image, r.o.cpus, runtime.NumCPU())
	rows := r.rows()
	width := len("measurement")
	for _, row := range rows {
		width = max(width, len(row.name))
	}
	fmt.Fprintf(w, "%-*s %4s %5s %9s %9s %9s %9s\n", width, "measurement", "conc", "n", "p50 ms", "p95 ms", "p99 ms", "per s")
	for _, row := range rows {
		if row.noPercents {
			p50 := "-"
			if row.p50 > 0 {
				p50 = fmt.Sprintf("%.1f", ms(row.p50))
			}
			fmt.Fprintf(w, "%-*s %4d %5d %9s %9s %9s %9.1f\n", width, row.name, row.conc, row.n, p50, "-", "-", row.rate)
			continue
		}
		fmt.Fprintf(w, "%-*s %4d %5d %9.1f %9.1f %9.1f %9.1f\n", width, row.name, row.conc, row.n, ms(row.p50), ms(row.p95), ms(row.p99), row.rate)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
