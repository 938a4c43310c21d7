package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/docker/docker/client"

	"github.com/codemode-go/codemode/edge/cmd/stackbench/plot"
	"github.com/codemode-go/codemode/internal/testkit/benchbase"
	"github.com/codemode-go/codemode/internal/testkit/launch"
)

type bench struct {
	o        options
	out, log io.Writer
	cmdline  string

	dir              string
	secret, key      string // the cluster secret; the edges' API key
	name             string // of the agent; labels its sandboxes
	procs            []*launch.Process
	agent, cp        *launch.Process
	edge, policyEdge *launch.Process
	docker           *client.Client
	baseline         *benchbase.Baseline // once started
}

// results is everything one run measured.
type results struct {
	machine   machine
	rows      []row
	execP50   time.Duration // docker exec python3 -c 'print(1)'
	start1    time.Duration // one python3 start inside the sandbox, one loop
	start4    float64       // python3 starts per second inside the sandbox, four loops
	stackUp   bool          // every service still running after concurrency 16
	queueWait time.Duration // the agent's queue timeout
	work      []workRow     // the realistic workload, both stacks
	memory    []stackMemory // of both stacks of the workload
	tls       *tlsResults   // nil: the TLS part did not run
}

// row is one line of the table.
type row struct {
	target, workload, mode string
	conc                   int
	stats
	noPercentiles bool   // a baseline that reports one figure
	cpu           cpuUse // per run; zero: not measured
}

func (b *bench) run(ctx context.Context) error {
	var err error
	b.docker, err = client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	if _, err := b.docker.Ping(ctx); err != nil {
		return fmt.Errorf("docker: %w (run make setup first)", err)
	}
	res := &results{queueWait: b.o.queue}
	res.machine = describe(ctx, b.docker)
	if err := b.up(ctx); err != nil {
		return err
	}
	var phases []func(context.Context, *results) error
	if b.o.doors() {
		phases = append(phases, b.measureBaselines, b.measureDoors, b.measurePolicies, b.measureMixed, b.downDoors)
	}
	if b.o.workload() {
		phases = append(phases, b.measureWorkload)
	}
	if b.o.tlsPart() {
		phases = append(phases, b.measureTLS)
	}
	for _, phase := range phases {
		if err := phase(ctx, res); err != nil {
			return err
		}
	}
	res.machine.loadEnd = loadAvg()
	return b.report(res)
}

// measureBaselines measures docker exec into a warm runsc container and
// python starts inside it, then removes it.
func (b *bench) measureBaselines(ctx context.Context, res *results) error {
	b.logf("baselines: docker exec and python starts inside a runsc sandbox")
	// With the agent's default CPU limit, one CPU.
	b.baseline = &benchbase.Baseline{Docker: b.docker, Image: b.o.image, Runtime: b.o.runtime, CPUs: 1, Pin: true,
		Labels: map[string]string{baselineLabel: b.name}}
	if err := b.baseline.Start(ctx); err != nil {
		return err
	}
	// The baseline container is idle afterwards, but it holds memory.
	defer b.removeBaseline()
	execLat, execElapsed, err := b.baseline.ExecLatency(ctx, b.o.execN)
	if err != nil {
		return err
	}
	execSamples := make([]sample, len(execLat))
	for i, d := range execLat {
		execSamples[i] = sample{kind: jobPrint.kind, d: d}
	}
	res.add(&measurement{target: "docker exec (warm runsc)", conc: 1, mode: "closed", samples: execSamples, elapsed: execElapsed}, "python3 -c print(1)")
	res.execP50 = res.rows[len(res.rows)-1].p50
	if res.start1, err = b.baseline.StartLoop(ctx, 1, b.o.loopN); err != nil {
		return err
	}
	par, err := b.baseline.StartLoop(ctx, 4, b.o.loopN)
	if err != nil {
		return err
	}
	res.start4 = 4 * float64(time.Second) / float64(par)
	res.rows = append(res.rows,
		row{target: "in-sandbox python3 start", workload: "1 loop", mode: "closed", conc: 1, noPercentiles: true,
			stats: stats{n: b.o.loopN, p50: res.start1, rate: float64(time.Second) / float64(res.start1)}},
		row{target: "in-sandbox python3 start", workload: "4 loops", mode: "closed", conc: 4, noPercentiles: true,
			stats: stats{n: 4 * b.o.loopN, rate: res.start4}})
	return nil
}

// measureDoors measures print(1) through the agent and every door of the
// plain edge, step by step, every target in turn, and within a step in
// rounds (each target a share of its runs per round, the rounds starting
// at targets spread over the list), so that a drift of the machine's load
// over the run, and whatever the target before leaves behind (sandboxes
// still scrubbing), falls on all of them alike.
func (b *bench) measureDoors(ctx context.Context, res *results) error {
	targets := append([]target{b.agentTarget()}, b.edgeTargets(b.edge)...)
	n := b.o.n
	for _, step := range []struct {
		mode string
		conc int
	}{{"closed", 1}, {"paced", 1}, {"closed", 4}, {"closed", 16}} {
		b.logf("%s, concurrency %d: %d targets in %d rounds", step.mode, step.conc, len(targets), rounds)
		total := max(n, 2*step.conc)
		if step.mode == "paced" {
			total = max(n/4, 4)
		}
		ms := make([]*measurement, len(targets))
		for r := range rounds {
			share := total/rounds + boolInt(r < total%rounds)
			for _, i := range rotation(len(targets), r*len(targets)/rounds) {
				var m *measurement
				var err error
				if step.mode == "paced" {
					m, err = paced(ctx, targets[i], repeat(jobPrint, share))
				} else {
					m, err = closed(ctx, targets[i], step.conc, 1, repeat(jobPrint, share))
				}
				if err != nil {
					return err
				}
				ms[i] = ms[i].merge(m)
			}
		}
		for _, m := range ms {
			res.add(m, jobPrint.kind)
		}
	}
	return nil
}

// measurePolicies measures print(1) at concurrency 16 through every door
// of the edge with the example policy chain.
func (b *bench) measurePolicies(ctx context.Context, res *results) error {
	for _, t := range b.edgeTargets(b.policyEdge) {
		t.name += "+policies"
		b.logf("%s, closed, concurrency 16", t.name)
		m, err := closed(ctx, t, 16, 1, repeat(jobPrint, max(b.o.n, 32)))
		if err != nil {
			return err
		}
		res.add(m, jobPrint.kind)
	}
	res.stackUp = b.running()
	return nil
}

// measureMixed runs the mixed workload through Connect JSON at
// concurrency 4, with a row for each kind of job.
func (b *bench) measureMixed(ctx context.Context, res *results) error {
	b.logf("mixed workload through connect-json, concurrency 4")
	connectJSON := b.edgeTargets(b.edge)[0]
	m, err := closed(ctx, connectJSON, 4, 1, mixedJobs(b.o.n, b.o.seed))
	if err != nil {
		return err
	}
	res.add(m, "mixed")
	for _, j := range []job{jobEcho, jobCPU, jobBusy} {
		var sub []sample
		for _, s := range m.samples {
			if s.kind == j.kind {
				sub = append(sub, s)
			}
		}
		res.add(&measurement{target: m.target, conc: m.conc, mode: m.mode, samples: sub}, "mixed: "+j.kind)
	}
	res.stackUp = res.stackUp && b.running()
	return nil
}

// downDoors stops the doors' stack once its parts are measured: the
// parts after it start stacks of their own, and an idle pool that shrinks
// back to its warm sandboxes would spend CPU during their turns.
func (b *bench) downDoors(context.Context, *results) error {
	b.stopStack(&stack{edg: b.policyEdge})
	b.stopStack(&stack{edg: b.edge, cp: b.cp, agent: b.agent})
	b.policyEdge, b.edge, b.cp, b.agent = nil, nil, nil, nil
	return nil
}

// report prints the report, and writes it and the plot where the options
// say.
func (b *bench) report(res *results) error {
	fmt.Fprint(b.out, renderText(res))
	if b.o.markdown != "" {
		plotRel := ""
		if b.o.png != "" {
			if rel, err := filepath.Rel(filepath.Dir(b.o.markdown), b.o.png); err == nil {
				plotRel = filepath.ToSlash(rel)
			}
		}
		if err := os.WriteFile(b.o.markdown, []byte(renderMarkdown(res, b.cmdline, plotRel)), 0o644); err != nil {
			return err
		}
		b.logf("wrote %s", b.o.markdown)
	}
	if b.o.png != "" {
		if err := plot.Write(b.o.png, plotSeries(res.rows), workloadBars(res.work)); err != nil {
			return err
		}
		b.logf("wrote %s", b.o.png)
	}
	return nil
}

// rounds is how many shares of its runs each target gets within a step.
const rounds = 4

// rotation is the order of n targets starting at first: 0..n-1 rotated.
func rotation(n, first int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = (i + first) % n
	}
	return order
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// merge returns the measurement of m's runs and then o's, one after the
// other; m may be nil.
func (m *measurement) merge(o *measurement) *measurement {
	if m == nil {
		return o
	}
	return &measurement{target: m.target, conc: m.conc, mode: m.mode,
		samples: append(slices.Clip(m.samples), o.samples...), elapsed: m.elapsed + o.elapsed, cpu: m.cpu.add(o.cpu),
		newSandboxes: m.newSandboxes + o.newSandboxes}
}

// add summarises m as a row of workload.
func (r *results) add(m *measurement, workload string) {
	r.rows = append(r.rows, row{target: m.target, workload: workload, mode: m.mode, conc: m.conc, stats: summarize(m.samples, m.elapsed), cpu: m.cpu.per(len(m.samples))})
}

// running reports whether every service is still running.
func (b *bench) running() bool {
	for _, p := range b.procs {
		select {
		case <-p.Exited():
			return false
		default:
		}
	}
	return true
}

func (b *bench) removeBaseline() {
	if b.baseline == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := b.baseline.Remove(ctx); err != nil {
		b.logf("%v", err)
	}
	b.baseline = nil
}

// cleanup stops the services (edges first, the agent last, which removes
// its sandboxes), removes what containers are left, and the build
// directory.
func (b *bench) cleanup() {
	for i := len(b.procs) - 1; i >= 0; i-- {
		if err := b.procs[i].Stop(stopTimeout); err != nil {
			b.logf("stop %s: %v", b.procs[i].Name, err)
		}
	}
	b.removeContainers()
	if b.docker != nil {
		b.docker.Close()
	}
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}
