package main

import (
	"bufio"
	"context"
	"debug/buildinfo"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/docker/docker/client"

	"github.com/codemode-go/codemode/internal/hugepages"
)

// machine describes where the bench ran.
type machine struct {
	cpu, kernel, docker, runsc, goVersion, commit string
	cpus                                          int
	memTotal                                      string
	loadStart, loadEnd                            string
	date                                          time.Time
}

// describe reads the machine's description; what cannot be read is "?".
func describe(ctx context.Context, dc *client.Client) machine {
	m := machine{cpu: "?", kernel: "?", docker: "?", runsc: "?", commit: "?", memTotal: "?",
		cpus: runtime.NumCPU(), goVersion: runtime.Version(), loadStart: loadAvg(), date: time.Now().UTC()}
	m.cpu = procField("/proc/cpuinfo", "model name", m.cpu)
	m.memTotal = procField("/proc/meminfo", "MemTotal", m.memTotal)
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = strings.TrimSpace(string(b))
	}
	if v, err := dc.ServerVersion(ctx); err == nil {
		m.docker = v.Version
	}
	if out, err := exec.CommandContext(ctx, "runsc", "--version").Output(); err == nil {
		m.runsc, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
	}
	if path, err := exec.LookPath("runsc"); err == nil {
		// A runsc built with go install says VERSION_MISSING; its
		// module version says which one it is.
		if bi, err := buildinfo.ReadFile(path); err == nil && bi.Main.Version != "" {
			m.runsc += " (module " + bi.Main.Path + "@" + bi.Main.Version + ")"
		}
	}
	if out, err := exec.CommandContext(ctx, "git", "rev-parse", "--short=12", "HEAD").Output(); err == nil {
		m.commit = strings.TrimSpace(string(out))
		if st, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
			m.commit += " (with uncommitted changes)"
		}
	}
	return m
}

// procField returns the value of the first "key: value" line of file.
func procField(file, key, fallback string) string {
	f, err := os.Open(file)
	if err != nil {
		return fallback
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return fallback
}

// loadAvg is the 1, 5 and 15 minute load average.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func (m machine) lines() []string {
	return []string{
		"CPU: " + m.cpu,
		fmt.Sprintf("CPUs: %d, memory: %s", m.cpus, m.memTotal),
		"kernel: " + m.kernel,
		"Docker Engine: " + m.docker,
		"runsc: " + m.runsc + "; transparent huge pages: " + hugepages.Host().String(),
		"Go: " + m.goVersion,
		"load average (1 5 15 min) at start: " + m.loadStart + ", at end: " + m.loadEnd,
		"date: " + m.date.Format(time.RFC3339),
		"commit: " + m.commit,
	}
}

var header = []string{"target", "workload", "mode", "conc", "n", "p50 ms", "p95 ms", "p99 ms", "runs/s", "errors"}

// cells is the table's rows as text.
func cells(rows []row) [][]string {
	out := [][]string{header}
	f := func(d time.Duration) string {
		if d == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f", ms(d))
	}
	for _, r := range rows {
		p50, p95, p99 := f(r.p50), f(r.p95), f(r.p99)
		if r.noPercentiles {
			p95, p99 = "-", "-"
		}
		rate := "-"
		if r.rate > 0 {
			rate = fmt.Sprintf("%.1f", r.rate)
		}
		out = append(out, []string{r.target, r.workload, r.mode, fmt.Sprint(r.conc), fmt.Sprint(r.n), p50, p95, p99, rate, errText(r.errs)})
	}
	return out
}

// errText is errs as "kind=count ..." in order of kind; "0" for none.
func errText(errs map[string]int) string {
	if len(errs) == 0 {
		return "0"
	}
	var s []string
	for _, k := range slices.Sorted(maps.Keys(errs)) {
		s = append(s, fmt.Sprintf("%s=%d", k, errs[k]))
	}
	return strings.Join(s, " ")
}

// check is one line of the Targets section.
type check struct {
	name   string
	value  float64
	op     string // "<=" or ">="
	bound  float64
	unit   string
	passed bool
	// lo and hi, if hi > 0, are a 90% interval of value from its runs
	// (p50RatioInterval); the verdict is value's.
	lo, hi float64
}

func newCheck(name string, value float64, op string, bound float64, unit string) check {
	ok := value <= bound
	if op == ">=" {
		ok = value >= bound
	}
	return check{name: name, value: value, op: op, bound: bound, unit: unit, passed: ok}
}

func (c check) String() string {
	verdict := "met"
	if !c.passed {
		verdict = "MISSED"
	}
	return fmt.Sprintf("%-66s %9.2f%-2s %-13s bound %s %.2f%s  %s", c.name, c.value, c.unit, c.interval(), c.op, c.bound, c.unit, verdict)
}

// interval is c's 90% interval as text, "-" if it has none.
func (c check) interval() string {
	if c.hi <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f-%.2f%s", c.lo, c.hi, c.unit)
}

// targetsLegend explains the Targets' intervals; its %d is
// bootstrapResamples.
const targetsLegend = `
90%% interval: of a p50 ratio, from the two rows' own runs, the 5th and 95th percentiles of
the ratio over %d resamples of those runs (a bootstrap). It says how far the runs pin
the ratio down, not how the host differs from one run of the benchmark to the next; a bound
inside the interval is met or missed by the draw of the runs.
`

// Bounds of the Targets section.
const (
	edgeOverAgent      = 1.1 // edge p50 / agent p50 at concurrency 1 and 4
	closedOverStart    = 0.5 // agent p50, closed loop at concurrency 1 / one in-sandbox interpreter start
	pacedOverStart     = 0.4 // agent p50, paced / one in-sandbox interpreter start
	agentRateOverLoops = 1.5 // agent runs/s at 4 / in-sandbox 4-loop starts/s
	tailOverMedian     = 3.0 // p99 / p50 at concurrency 4
)

var doors = []string{"connect-json", "grpc", "grpc-web", "mcp", "run"}

// checks computes the Targets of res, leaving out those without rows.
func checks(res *results) []check {
	find := func(target, mode string, conc int) (row, bool) {
		for _, r := range res.rows {
			if r.target == target && r.mode == mode && r.conc == conc && r.workload == jobPrint.kind {
				return r, true
			}
		}
		return row{}, false
	}
	var cs []check
	for _, conc := range []int{1, 4} {
		a, ok := find("agent", "closed", conc)
		if !ok || a.p50 == 0 {
			continue
		}
		for _, d := range doors {
			if e, ok := find(d, "closed", conc); ok {
				cs = append(cs, newCheck(fmt.Sprintf("%s p50 / agent p50, concurrency %d", d, conc), float64(e.p50)/float64(a.p50), "<=", edgeOverAgent, "x"))
			}
		}
	}
	if len(res.rows) > 0 {
		up := 0.0
		if res.stackUp {
			up = 1
		}
		cs = append(cs, newCheck("services still running after concurrency 16 (1 = all)", up, ">=", 1, ""))
	}
	for _, t := range append(append([]string{"agent"}, doors...), suffixed(doors, "+policies")...) {
		r, ok := find(t, "closed", 16)
		if !ok {
			continue
		}
		other := 0
		for k, v := range r.errs {
			if k != "resource_exhausted" {
				other += v
			}
		}
		cs = append(cs,
			newCheck(t+" c16: failures other than resource_exhausted", float64(other), "<=", 0, ""),
			newCheck(t+" c16: p99 (ms) against the agent's queue timeout", ms(r.p99), "<=", ms(res.queueWait), ""))
		if strings.HasSuffix(t, "+policies") {
			cs = append(cs, newCheck(t+" c16: policy_unavailable failures", float64(r.errs[kindPolicyUnavailable]), "<=", 0, ""))
		}
	}
	if a, ok := find("agent", "closed", 4); ok && res.start4 > 0 && a.p50 > 0 {
		cs = append(cs,
			newCheck("agent c4 runs/s / in-sandbox 4-loop python starts/s", a.rate/res.start4, ">=", agentRateOverLoops, "x"),
			newCheck("agent c4 p99 / p50", float64(a.p99)/float64(a.p50), "<=", tailOverMedian, "x"))
	}
	if res.start1 > 0 {
		if a, ok := find("agent", "closed", 1); ok {
			cs = append(cs, newCheck("agent c1 closed p50 / in-sandbox python start", float64(a.p50)/float64(res.start1), "<=", closedOverStart, "x"))
		}
		if a, ok := find("agent", "paced", 1); ok {
			cs = append(cs, newCheck("agent paced p50 / in-sandbox python start", float64(a.p50)/float64(res.start1), "<=", pacedOverStart, "x"))
		}
	}
	return append(append(cs, workloadChecks(res)...), tlsChecks(res)...)
}

func suffixed(s []string, suffix string) []string {
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = x + suffix
	}
	return out
}

// renderText is the report as printed: the machine, the table, the
// baseline ratios and the Targets.
func renderText(res *results) string {
	var b strings.Builder
	b.WriteString("\n")
	for _, l := range res.machine.lines() {
		b.WriteString(l + "\n")
	}
	b.WriteString("\n")
	if len(res.rows) > 0 {
		writeText(&b, cells(res.rows), func(i int) bool { return i < 3 || i == len(header)-1 })
		b.WriteString(legend)
	}
	if t := cpuCells(res.rows); len(t) > 1 {
		b.WriteString("\nCPU per run, ms:\n")
		writeText(&b, t, func(i int) bool { return i < 3 })
		b.WriteString(cpuLegend)
	}
	writeWorkText(&b, res)
	writeTLSText(&b, res)
	b.WriteString("\nTargets (ratios of this run):\n")
	for _, c := range checks(res) {
		b.WriteString("  " + c.String() + "\n")
	}
	return b.String()
}

// writeText writes table t as aligned columns, left-aligned where left
// says so and right-aligned elsewhere.
func writeText(b *strings.Builder, t [][]string, left func(i int) bool) {
	var widths []int
	for _, r := range t {
		for i, c := range r {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len(c))
		}
	}
	for _, r := range t {
		var line strings.Builder
		for i, c := range r {
			if left(i) {
				fmt.Fprintf(&line, "%-*s  ", widths[i], c)
			} else {
				fmt.Fprintf(&line, "%*s  ", widths[i], c)
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
}

// writeMarkdown writes table t, whose first row is its header.
func writeMarkdown(b *strings.Builder, t [][]string) {
	for i, r := range t {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
		if i == 0 {
			b.WriteString("|" + strings.Repeat(" --- |", len(r)) + "\n")
		}
	}
}

var cpuHeader = []string{"target", "workload", "mode", "conc", "host", "agent", "control plane", "edge"}

// cpuCells is the CPU table as text: the rows whose CPU was measured.
func cpuCells(rows []row) [][]string {
	out := [][]string{cpuHeader}
	f := func(d time.Duration) string { return fmt.Sprintf("%.1f", ms(d)) }
	for _, r := range rows {
		if r.cpu.host == 0 {
			continue
		}
		edge := f(r.cpu.edge)
		if r.target == "agent" {
			edge = "-"
		}
		out = append(out, []string{r.target, r.workload, r.mode, fmt.Sprint(r.conc), f(r.cpu.host), f(r.cpu.agent), f(r.cpu.cp), edge})
	}
	return out
}

const cpuLegend = `
host: the busy time of all the host's CPUs over the measurement (/proc/stat), divided by its
runs: the sandboxes' gVisor kernels, the container engine, the services, this bench and
anything else running on the machine; paced rows include the pauses between runs. agent,
control plane, edge: each process's own (/proc/PID/stat), in 10 ms ticks.
`

const legend = `
closed: each worker starts its next run when its last one ends; paced: one run every 500 ms.
Percentiles are over every call, failed or not. errors: failures by kind (a Connect code;
policy_unavailable; mcp_tool_error, mcp_jsonrpc; http_STATUS of POST /run; exit_nonzero).
`

// renderMarkdown is the report as BENCHMARKS.md.
// plot is the plot's path relative to the file; "": none.
func renderMarkdown(res *results, cmdline, plot string) string {
	var b strings.Builder
	b.WriteString("# Benchmarks\n\nThis file is written by `make bench` (edge/cmd/stackbench); do not edit it by hand.\n")
	if plot != "" {
		fmt.Fprintf(&b, "\n![p50 and p99 latency against concurrency; the realistic workload's p50, preloaded and fresh](%s)\n", plot)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "Command: `%s`\n\n## Machine\n\n", cmdline)
	for _, l := range res.machine.lines() {
		b.WriteString("- " + l + "\n")
	}
	if len(res.rows) > 0 {
		b.WriteString("\n## Results\n\n")
		writeMarkdown(&b, cells(res.rows))
		b.WriteString(legend)
	}
	if t := cpuCells(res.rows); len(t) > 1 {
		b.WriteString("\n## CPU per run\n\nMilliseconds of CPU per run.\n\n")
		writeMarkdown(&b, t)
		b.WriteString(cpuLegend)
	}
	writeWorkMarkdown(&b, res)
	writeTLSMarkdown(&b, res)
	b.WriteString("\n## Targets\n\nRatios of this run.\n\n| measure | value | 90% interval | bound | verdict |\n| --- | --- | --- | --- | --- |\n")
	intervals := false
	for _, c := range checks(res) {
		verdict := "met"
		if !c.passed {
			verdict = "MISSED"
		}
		fmt.Fprintf(&b, "| %s | %.2f%s | %s | %s %.2f%s | %s |\n", c.name, c.value, c.unit, c.interval(), c.op, c.bound, c.unit, verdict)
		intervals = intervals || c.hi > 0
	}
	if intervals {
		fmt.Fprintf(&b, targetsLegend, bootstrapResamples)
	}
	return b.String()
}
