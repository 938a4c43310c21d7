package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/testkit/benchbase"
	"github.com/codemode-go/codemode/internal/testkit/launch"
	"github.com/codemode-go/codemode/internal/testkit/promtext"
)

// workloadItems are the code models send, each run stateless: code that
// imports nothing, and code that imports the libraries a preloaded parent
// holds. The matplotlib item must return the figure it saves.
var workloadItems = []job{
	{kind: "python print(1)", language: "python", code: "print(1)"},
	{kind: "requests: prepared request", language: "python",
		code: "import requests\nr = requests.Request('GET', 'http://127.0.0.1/x', params={'q': 1}).prepare()\nprint(r.url)"},
	{kind: "numpy: 500x500 product, eigenvalues", language: "python",
		code: "import numpy as np\na = np.random.rand(500, 500)\nb = a @ a\nprint(np.linalg.eigvals(b)[:1].real)"},
	{kind: "pandas: 10,000 rows, groupby, describe", language: "python",
		code: "import numpy as np, pandas as pd\ndf = pd.DataFrame({'k': np.random.randint(0, 10, 10000), 'v': np.random.rand(10000)})\nprint(df.groupby('k').v.describe().shape)"},
	{kind: "matplotlib: line plot, histogram saved", language: "python", artifact: "plot.png",
		code: "import numpy as np, matplotlib.pyplot as plt\nfig, (a, b) = plt.subplots(1, 2)\na.plot(np.arange(100) ** 0.5)\nb.hist(np.random.randn(1000), bins=30)\nfig.savefig('/workspace/outputs/plot.png')"},
	{kind: "javascript console.log(1)", language: "javascript", code: "console.log(1)"},
}

// The two stacks of the workload: the same services, the agent with its
// preloaded parents, and the agent with none (each run's interpreter
// started fresh).
const (
	stackPreload = "preload"
	stackFresh   = "fresh"
)

// workloadSteps are the ways each item is measured.
var workloadSteps = []struct {
	mode string
	conc int
}{{"paced", 1}, {"closed", 1}, {"closed", 4}}

// noRegressionRuns multiplies the runs of workloadNoRegression's items,
// whose 1.1x bounds are closer than a p50 of -workload-n runs holds, and
// their rounds, so that the host's drift falls on both stacks alike.
const noRegressionRuns = 3

// noRegressionClosedWarmups is how many unmeasured runs each worker makes
// before a turn of workloadNoRegression's items in a closed loop: three
// sandboxes then hold the item's interpreter prestarted. The turn's CPU
// reading waits for the agent to be quiet after them (target.startMeter),
// so its measured runs begin on an idle agent: the first ones find warm
// sandboxes, the next ones wait for the Resets of those before them (each
// prestarts the next interpreter, two to three times a run of print(1),
// and keeps its run's CPU slot). With one warm-up, a turn's six measured
// runs moved its p50 from one mode to the other from run to run (print(1):
// 0.91x to 1.84x the fresh stack's). RATIONALE.md says what else was
// tried.
const noRegressionClosedWarmups = 3

// workloadRounds is how many shares of its runs each stack gets per item
// and step, the stacks taking turns.
const workloadRounds = 2

// stack is one agent, the control plane in front of it and an edge in
// front of that.
type stack struct {
	name           string // the agent's, which labels its sandboxes
	agent, cp, edg *launch.Process
	metrics        string // the agent's /metrics URL
}

// memUse is what a stack holds in memory at one moment.
type memUse struct {
	agentRSS   int64 // the agent process's resident set
	sandboxes  int   // its sandboxes
	sandboxMem int64 // their cgroups' memory use, summed
}

// stackMemory is the memory of both stacks, once warm and after the
// workload.
type stackMemory struct {
	stack       string
	warm, after memUse
	loadWarm    string
}

// measureWorkload runs workloadItems through the edges of two stacks
// started for it and stopped after: one whose agent preloads
// (--preload=default) and one whose agent does not (--preload=). Both
// begin alike, with their warm sandboxes and nothing run, so neither
// carries what the doors' parts left in a pool (sandboxes near their
// --max-reuse runs, a pool grown by concurrency 16). Each item, step by
// step, goes to both stacks in turns, so that both see the same host.
func (b *bench) measureWorkload(ctx context.Context, res *results) error {
	kinds := []struct{ name, preload string }{{stackPreload, "--preload=default"}, {stackFresh, "--preload="}}
	var stacks []*stack
	defer func() {
		for _, s := range stacks {
			b.stopStack(s)
		}
	}()
	for _, k := range kinds {
		s, err := b.upStack(ctx, b.name+"-"+k.name, k.preload)
		if s != nil {
			stacks = append(stacks, s)
		}
		if err != nil {
			return err
		}
	}
	var targets []target
	for i, s := range stacks {
		res.memory = append(res.memory, stackMemory{stack: kinds[i].name, warm: b.memoryOf(ctx, s), loadWarm: loadAvg()})
		targets = append(targets, b.workloadTarget(kinds[i].name, s, stacks))
	}
	// A paced turn begins with as many runs at once as the agent has CPU
	// sets (see spread); both agents have the same.
	speeds, err := setSpeeds(ctx, stacks[0].metrics)
	if err != nil {
		return err
	}
	spreadN := min(max(len(speeds), 1), b.o.warm)
	for _, step := range workloadSteps {
		for _, it := range workloadItems {
			n, rounds := b.o.workloadN, workloadRounds
			if slices.Contains(workloadNoRegression, it.kind) {
				n, rounds = n*noRegressionRuns, rounds*noRegressionRuns
			}
			b.logf("workload %s, %s, concurrency %d: both stacks in %d rounds", it.kind, step.mode, step.conc, rounds)
			total := max(n, 2*step.conc)
			ms := make([]*measurement, len(targets))
			for r := range rounds {
				share := total/rounds + boolInt(r < total%rounds)
				for _, i := range rotation(len(targets), r) {
					var (
						m   *measurement
						err error
					)
					if step.mode == "paced" {
						if err = spread(ctx, targets[i], spreadN, it); err != nil {
							return err
						}
						m, err = paced(ctx, targets[i], repeat(it, share))
					} else {
						warmups := 1
						if slices.Contains(workloadNoRegression, it.kind) {
							warmups = noRegressionClosedWarmups
						}
						m, err = closed(ctx, targets[i], step.conc, warmups, repeat(it, share))
					}
					if err != nil {
						return err
					}
					ms[i] = ms[i].merge(m)
				}
			}
			load, spread := loadAvg(), cpuSpread(ctx, stacks[0].metrics)
			for _, m := range ms {
				res.work = append(res.work, workRow{row: row{target: m.target, workload: it.kind, mode: m.mode, conc: m.conc,
					stats: summarize(m.samples, m.elapsed), cpu: m.cpu.per(len(m.samples))}, load: load, cpuSpread: spread, newSandboxes: m.newSandboxes})
			}
		}
	}
	for i, s := range stacks {
		res.memory[i].after = b.memoryOf(ctx, s)
	}
	return nil
}

// workRow is one line of the workload's table: a row, the load average
// (1 min) when it was measured, and the sandboxes started meanwhile.
type workRow struct {
	row
	load         string
	cpuSpread    string // see cpuSpread
	newSandboxes int    // sandboxes the agent started during the row's runs
}

// cpuSpread reads the agent's /metrics at url and returns its slowest CPU
// set's last measure over its fastest one's (codemode_agent_cpu_set_speed_seconds),
// as "1.04x"; "-" if it measures none (pins nothing).
func cpuSpread(ctx context.Context, url string) string {
	speeds, err := setSpeeds(ctx, url)
	if err != nil {
		return "?"
	}
	var lo, hi float64
	for _, v := range speeds {
		if lo == 0 || v < lo {
			lo = v
		}
		hi = max(hi, v)
	}
	if lo == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", hi/lo)
}

// setSpeeds reads the agent's /metrics at url and returns the last
// measure of each CPU set it pins sandboxes to
// (codemode_agent_cpu_set_speed_seconds), those not yet measured left
// out: none if it pins nothing.
func setSpeeds(ctx context.Context, url string) ([]float64, error) {
	fams, err := promtext.Scrape(ctx, url)
	if err != nil {
		return nil, err
	}
	var speeds []float64
	for _, m := range fams["codemode_agent_cpu_set_speed_seconds"].GetMetric() {
		if v := m.GetGauge().GetValue(); v > 0 {
			speeds = append(speeds, v)
		}
	}
	return speeds, nil
}

// workloadTarget is the Connect JSON door of s's edge, its CPU metered
// with its sandboxes'. Its meter reads when every stack of all is quiet,
// s's included: a turn then begins with no Reset or sandbox start of
// the other stack's turn before it still using the CPUs.
func (b *bench) workloadTarget(name string, s *stack, all []*stack) target {
	c := edgev1connect.NewExecutionServiceClient(b.authClient(b.key), s.edg.URL(), connect.WithProtoJSON())
	return target{name: name,
		dial:      func(context.Context) (caller, error) { return edgeCaller{c}, nil },
		cpu:       cpuMeterOf(s.agent, s.cp, s.edg),
		sandboxes: func() map[string]time.Duration { return b.sandboxCPU(s.name) },
		quiet: func() {
			for _, o := range all {
				b.waitQuiet(o)
			}
		},
	}
}

// quietTimeout bounds the wait for an agent to become quiet; quietPoll is
// how often it asks.
const quietTimeout, quietPoll = time.Minute, 25 * time.Millisecond

// waitQuiet waits until s's agent is quiet: no sandbox of it busy,
// starting or recycling (its codemode_agent_sandboxes gauges), so that a
// row's CPU holds its runs' scrubs and nothing of the row before (see
// RATIONALE.md). Past quietTimeout it logs and lets the measurement go on.
func (b *bench) waitQuiet(s *stack) {
	ctx, cancel := context.WithTimeout(context.Background(), quietTimeout)
	defer cancel()
	var err error
	for {
		var quiet bool
		if quiet, err = agentQuiet(ctx, s.metrics); err == nil && quiet {
			return
		}
		select {
		case <-ctx.Done():
			b.logf("the %s agent was not quiet within %s (%v); measuring on", s.name, quietTimeout, err)
			return
		case <-time.After(quietPoll):
		}
	}
}

// quietStates are the states of codemode_agent_sandboxes in which a
// sandbox uses CPU for runs: none in any of them is a quiet agent.
var quietStates = []string{"busy", "starting", "recycling"}

// agentQuiet reads the agent's /metrics at url and reports whether no
// sandbox is in any of quietStates.
func agentQuiet(ctx context.Context, url string) (bool, error) {
	fams, err := promtext.Scrape(ctx, url)
	if err != nil {
		return false, err
	}
	if fams["codemode_agent_sandboxes"] == nil {
		return false, fmt.Errorf("%s: no codemode_agent_sandboxes", url)
	}
	for _, state := range quietStates {
		if promtext.Sample(fams, "codemode_agent_sandboxes", map[string]string{"state": state}) != 0 {
			return false, nil
		}
	}
	return true, nil
}

// metricsURL waits, at most listenTimeout, for p's "serving metrics" log
// line (--metrics-addr) and returns the URL of its /metrics.
func metricsURL(p *launch.Process) (string, error) {
	deadline := time.Now().Add(listenTimeout)
	for {
		for _, line := range p.LogLines() {
			var rec struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "serving metrics" && rec.Addr != "" {
				return "http://" + rec.Addr + "/metrics", nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%s: no \"serving metrics\" line within %s", p.Name, listenTimeout)
		}
		time.Sleep(quietPoll)
	}
}

// upStack starts an agent named name with the main agent's settings and
// extra, a control plane in front of it and an edge in front of that,
// and waits for the agent's warm sandboxes.
func (b *bench) upStack(ctx context.Context, name string, extra ...string) (*stack, error) {
	s := &stack{name: name}
	var err error
	env := []string{"CODEMODE_CLUSTER_SECRET=" + b.secret}
	if s.agent, err = b.start(ctx, "agent", env, b.agentArgs(name, extra...)...); err != nil {
		return nil, err
	}
	if s.metrics, err = metricsURL(s.agent); err != nil {
		return nil, err
	}
	if s.cp, err = b.start(ctx, "controlplane", append(env, "REMOTE_HOSTS="+s.agent.Addr), "--addr", "127.0.0.1:0", "--poll-interval", "200ms"); err != nil {
		return nil, err
	}
	if s.edg, err = b.start(ctx, "edge", append(env, "CODE_EXECUTION_HOST="+s.cp.URL()), "--addr", "127.0.0.1:0", "--api-keys", filepath.Join(b.dir, "keys.json")); err != nil {
		return nil, err
	}
	b.logf("waiting for the %s agent's %d warm sandboxes", name, b.o.warm)
	return s, b.waitReady(ctx, s.edg, s.agent)
}

// stopStack stops s's services, the agent last (it removes its
// sandboxes).
func (b *bench) stopStack(s *stack) {
	ps := slices.DeleteFunc([]*launch.Process{s.edg, s.cp, s.agent}, func(p *launch.Process) bool { return p == nil })
	for _, p := range ps {
		if err := p.Stop(stopTimeout); err != nil {
			b.logf("stop %s: %v", p.Name, err)
		}
	}
	b.procs = slices.DeleteFunc(b.procs, func(p *launch.Process) bool { return slices.Contains(ps, p) })
}

// sandboxes are the IDs of the running containers of agent.
func (b *bench) sandboxes(ctx context.Context, agent string) []string {
	list, err := b.docker.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", "codemode.agent="+agent))})
	if err != nil {
		b.logf("list the sandboxes of %s: %v", agent, err)
		return nil
	}
	ids := make([]string, len(list))
	for i, c := range list {
		ids[i] = c.ID
	}
	return ids
}

// sandboxCPU is the CPU each running sandbox of agent has used so far,
// from its cgroup (under runsc: the sandbox's kernel and everything it
// runs). What cannot be read is left out.
func (b *bench) sandboxCPU(agent string) map[string]time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[string]time.Duration{}
	for _, id := range b.sandboxes(ctx, agent) {
		if d, ok := benchbase.ContainerCPU(id); ok {
			out[id] = d
		}
	}
	return out
}

// sandboxDelta is the CPU the sandboxes used between two readings: a
// sandbox that appeared counts whole (its start is part of the cost), one
// that is gone counts nothing past its last reading.
func sandboxDelta(before, after map[string]time.Duration) time.Duration {
	var sum time.Duration
	for id, d := range after {
		sum += d - before[id]
	}
	return sum
}

// memoryOf reads s's agent's RSS and its sandboxes' memory.
func (b *bench) memoryOf(ctx context.Context, s *stack) memUse {
	m := memUse{agentRSS: processRSS(s.agent.Pid())}
	for _, id := range b.sandboxes(ctx, s.name) {
		m.sandboxes++
		m.sandboxMem += benchbase.ContainerMemory(id)
	}
	return m
}

// processRSS is a process's resident set in bytes; 0 when unknown.
func processRSS(pid int) int64 {
	kb, err := strconv.ParseInt(strings.TrimSuffix(procField(fmt.Sprintf("/proc/%d/status", pid), "VmRSS", ""), " kB"), 10, 64)
	if err != nil {
		return 0
	}
	return kb << 10
}
