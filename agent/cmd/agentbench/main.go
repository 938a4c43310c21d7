// Command agentbench measures the agent against its baselines in one run and
// prints a table: stateless runs through the agent's API at concurrency 1
// and 4, `docker exec` on a warm runsc container, Python start time inside a
// runsc sandbox (one loop and four parallel loops), a trivial statement in a
// stateful session, the agent's own memory with 8 warm sandboxes, and, as
// the same run's baseline for prestarted interpreters, stateless Python on a
// second agent started with --prestart=false.
//
// It builds the agent and the runner from this module, starts the agent as
// a process on a loopback port, and removes everything it started when it
// ends. Every loop is bounded. Run it from the repository root:
//
//	go run ./agent/cmd/agentbench [-n 100]
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/agent/internal/agentd"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/server"
)

func main() { cli.Main(run) }

type options struct {
	n       int // runs per API measurement
	execN   int // docker exec runs
	loopN   int // interpreter starts per in-sandbox loop
	warm    int
	image   string
	runtime string
	cpus    float64
}

func run(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	var o options
	f := flag.NewFlagSet("agentbench", flag.ContinueOnError)
	f.SetOutput(stderr)
	f.IntVar(&o.n, "n", 100, "runs per agent measurement")
	f.IntVar(&o.execN, "exec-n", 30, "docker exec runs for the baseline")
	f.IntVar(&o.loopN, "loop-n", 20, "interpreter starts per loop inside the sandbox")
	f.IntVar(&o.warm, "warm", 8, "warm sandboxes of the agent (its memory is measured with them)")
	f.StringVar(&o.image, "image", "codemode-sandbox:bookworm", "sandbox image")
	f.StringVar(&o.runtime, "runtime", "runsc", "OCI runtime")
	f.Float64Var(&o.cpus, "cpus", float64(runtime.NumCPU()), "CPU limit of the agent's sandboxes and of the baseline container alike")
	if err := f.Parse(args); err != nil {
		return err
	}
	if o.n < 10 || o.n > 10000 || o.execN < 5 || o.execN > 1000 || o.loopN < 5 || o.loopN > 500 {
		return errors.New("bounds: -n 10..10000, -exec-n 5..1000, -loop-n 5..500")
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Minute)
	defer cancel()
	b := &bench{o: o, out: stdout, log: stderr}
	defer b.cleanup()
	return b.run(ctx)
}

type bench struct {
	o        options
	out, log io.Writer
	dir      string
	agent    *agentProc // the agent measured
	cold     *agentProc // one whose runners prestart no interpreter
	docker   *client.Client
	baseline string // id of the baseline container
	name     string // of the agent
	rows     []row
}

// agentProc is an agent running as a process of its own.
type agentProc struct {
	cmd  *exec.Cmd
	errc chan error // its exit
	url  string
	once sync.Once
}

// stop stops the agent (which removes its sandboxes) and waits for it.
func (a *agentProc) stop() {
	if a == nil {
		return
	}
	a.once.Do(func() {
		a.cmd.Process.Signal(os.Interrupt)
		select {
		case <-a.errc:
		case <-time.After(time.Minute):
			a.cmd.Process.Kill()
		}
	})
}

type row struct {
	name       string
	conc       int
	p50        time.Duration
	p95, p99   time.Duration
	rate       float64 // per second
	n          int
	noPercents bool
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "agentbench: "+format+"\n", args...)
}

func (b *bench) run(ctx context.Context) error {
	var err error
	b.docker, err = client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return err
	}
	if _, err := b.docker.Ping(ctx); err != nil {
		return fmt.Errorf("docker: %w (run agent/host/setup.sh first)", err)
	}
	if b.dir, err = os.MkdirTemp("", "agentbench-"); err != nil {
		return err
	}
	b.logf("building agent and runner")
	build := exec.CommandContext(ctx, "go", "build", "-o", b.dir+"/", "./agent/cmd/agent", "./agent/cmd/runner")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stderr = b.log
	if err := build.Run(); err != nil {
		return fmt.Errorf("build (run from the repository root): %w", err)
	}

	// The agent, as a process of its own.
	b.name = fmt.Sprintf("bench-%d", os.Getpid())
	if b.agent, err = b.startAgent(ctx, b.name); err != nil {
		return err
	}
	c := agentv1connect.NewAgentServiceClient(server.NewClient(), b.agent.url)
	b.logf("waiting for %d warm sandboxes", b.o.warm)
	if err := waitWarm(ctx, c, b.o.warm); err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // let the start-up garbage be collected
	rss, err := rssOf(b.agent.cmd.Process.Pid)
	if err != nil {
		return err
	}

	// Baselines on one warm runsc container with the same image.
	b.logf("starting the baseline container")
	if err := b.startBaseline(ctx); err != nil {
		return err
	}
	b.logf("docker exec baseline")
	execLat, err := b.dockerExec(ctx, b.o.execN)
	if err != nil {
		return err
	}
	b.addRow("docker exec python3 -c 'print(1)' (Engine API, warm runsc)", 1, execLat, 0)
	b.logf("python start inside the sandbox")
	serialStart, err := b.inSandboxLoop(ctx, 1)
	if err != nil {
		return err
	}
	parStart, err := b.inSandboxLoop(ctx, 4)
	if err != nil {
		return err
	}
	b.rows = append(b.rows,
		row{name: "python3 start inside a runsc sandbox, 1 loop", conc: 1, p50: serialStart, rate: float64(time.Second) / float64(serialStart), n: b.o.loopN, noPercents: true},
		row{name: "python3 start inside a runsc sandbox, 4 loops", conc: 4, rate: 4 * float64(time.Second) / float64(parStart), n: 4 * b.o.loopN, noPercents: true},
	)

	b.logf("runner run and scrub, one sandbox")
	split, err := b.runnerSplit(ctx)
	if err != nil {
		return err
	}

	// The agent's API.
	type stat struct {
		p50  time.Duration
		rate float64
	}
	results := map[string]stat{}
	var cpu cpuUse
	for _, tc := range []struct {
		name, lang, code string
		conc             int
	}{
		{"agent stateless python print(1)", "python", "print(1)", 1},
		{"agent stateless python print(1)", "python", "print(1)", 4},
		{"agent stateless bash echo 1", "bash", "echo 1", 1},
		{"agent stateless bash echo 1", "bash", "echo 1", 4},
	} {
		b.logf("%s, concurrency %d", tc.name, tc.conc)
		before := b.cpu(ctx)
		lat, elapsed, err := b.agentRuns(ctx, c, &executionv1.Execution{Language: tc.lang, Code: tc.code}, tc.conc, b.o.n)
		if err != nil {
			return err
		}
		if tc.lang == "python" && tc.conc == 4 {
			cpu = b.cpu(ctx).sub(before, len(lat)+3)
		}
		b.addRow(tc.name, tc.conc, lat, elapsed)
		results[fmt.Sprintf("%s/%d", tc.lang, tc.conc)] = stat{percentile(lat, 50), float64(len(lat)) / elapsed.Seconds()}
	}
	b.logf("stateful session")
	sess, err := c.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "python"}))
	if err != nil {
		return err
	}
	id := sess.Msg.GetSession().GetId()
	lat, elapsed, err := b.agentRuns(ctx, c, &executionv1.Execution{Language: "python", Code: "x = 1", SessionId: id}, 1, b.o.n)
	if err != nil {
		return err
	}
	c.CloseSession(ctx, connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: id}))
	b.addRow("agent stateful session: x = 1", 1, lat, elapsed)
	statefulP50 := percentile(lat, 50)
	paced, err := b.pacedRows(ctx, c, "")
	if err != nil {
		return err
	}
	b.agent.stop()

	// The same run without prestarted interpreters: what prestarting saves.
	b.logf("agent stateless python print(1), concurrency 1, without prestart")
	if b.cold, err = b.startAgent(ctx, b.name+"-cold", "--prestart=false"); err != nil {
		return err
	}
	cc := agentv1connect.NewAgentServiceClient(server.NewClient(), b.cold.url)
	if err := waitWarm(ctx, cc, b.o.warm); err != nil {
		return err
	}
	lat, elapsed, err = b.agentRuns(ctx, cc, &executionv1.Execution{Language: "python", Code: "print(1)"}, 1, b.o.n)
	if err != nil {
		return err
	}
	b.addRow("agent stateless python print(1), --prestart=false", 1, lat, elapsed)
	coldP50 := percentile(lat, 50)
	pacedCold, err := b.pacedRows(ctx, cc, ", --prestart=false")
	if err != nil {
		return err
	}
	b.cold.stop()

	// Report.
	b.printTable()
	execP50 := percentile(execLat, 50)
	py1 := results["python/1"]
	py4 := results["python/4"]
	parRate := 4 * float64(time.Second) / float64(parStart)
	for _, r := range split {
		mem := ""
		if r.memory > 0 {
			mem = fmt.Sprintf(", sandbox memory after it %.1f MiB", float64(r.memory)/(1<<20))
		}
		fmt.Fprintf(b.out, "runner in one sandbox, %s: wall %.1f ms, sandbox CPU %.1f ms%s\n", r.what, ms(r.wall), ms(r.cpu), mem)
	}
	if cpu.sandboxes > 0 {
		fmt.Fprintf(b.out, "\nCPU per stateless python run at concurrency 4: sandboxes (runner run + scrub, under runsc) %.1f ms, agent %.1f ms, dockerd+containerd %.1f ms\n",
			ms(cpu.sandboxes), ms(cpu.agent), ms(cpu.engine))
	}
	fmt.Fprintf(b.out, "\nPrestarted interpreters: stateless python p50 %.1f ms against %.1f ms without (%.2fx)\n",
		ms(py1.p50), ms(coldP50), float64(py1.p50)/float64(coldP50))
	for _, lang := range []string{"python", "javascript"} {
		fmt.Fprintf(b.out, "  one %s run every %v: p50 %.1f ms against %.1f ms without (%.2fx)\n",
			lang, pace, ms(paced[lang]), ms(pacedCold[lang]), float64(paced[lang])/float64(pacedCold[lang]))
	}
	fmt.Fprintf(b.out, "\nTargets (ratios of this run):\n")
	check := func(name string, value, target float64, lower bool, unit string) {
		ok := value <= target
		if !lower {
			ok = value >= target
		}
		verdict := "met"
		if !ok {
			verdict = "MISSED"
		}
		op := "<="
		if !lower {
			op = ">="
		}
		fmt.Fprintf(b.out, "  %-62s %8.2f%s  target %s %.2f%s  %s\n", name, value, unit, op, target, unit, verdict)
	}
	check("agent stateless python p50 / docker exec p50", float64(py1.p50)/float64(execP50), 0.6, true, "x")
	check("agent stateless python p50 / in-sandbox python start", float64(py1.p50)/float64(serialStart), 1.5, true, "x")
	check("stateful-session trivial statement p50 (ms)", ms(statefulP50), 20, true, "")
	check("agent python throughput at concurrency 4 / in-sandbox 4-loop rate", py4.rate/parRate, 0.6, false, "x")
	check(fmt.Sprintf("agent RSS with %d warm sandboxes (MB)", b.o.warm), float64(rss)/(1<<20), 64, true, "")
	return nil
}

type splitRow struct {
	what      string
	wall, cpu time.Duration
	memory    int64 // after a scrub: the sandbox's memory use (cgroup v1), 0 if unknown
}

// runnerSplit measures, in one sandbox made as the agent makes them, what a
// stateless run costs inside the sandbox: the run itself and the scrub that
// follows it, each in wall time and in the sandbox's CPU time (cgroup v1
// accounting; 0 where it cannot be read). Python is measured with and
// without a prestarted interpreter (whose start is part of the scrub).
func (b *bench) runnerSplit(ctx context.Context) ([]splitRow, error) {
	var rows []splitRow
	for _, tc := range []struct {
		lang, code string
		prestart   bool
		what       string
	}{
		{"python", "print(1)", true, "python print(1) run, prestarted interpreter"},
		{"python", "print(1)", false, "python print(1) run, --prestart=false"},
		{"bash", "echo 1", true, "bash echo 1 run"},
	} {
		run, reset, err := b.splitOne(ctx, tc.lang, tc.code, tc.prestart)
		if err != nil {
			return nil, err
		}
		scrub := "scrub (Reset) after it"
		if tc.prestart && tc.lang == "python" {
			scrub += ", with the next prestart"
		}
		rows = append(rows, splitRow{what: tc.what, wall: run.wall, cpu: run.cpu},
			splitRow{what: scrub, wall: reset.wall, cpu: reset.cpu, memory: reset.memory})
	}
	return rows, nil
}

// splitOne measures runs of code, each followed by a Reset, in one sandbox.
func (b *bench) splitOne(ctx context.Context, lang, code string, prestart bool) (run, reset splitRow, err error) {
	cfg := agentd.DefaultConfig()
	cfg.Name = b.name + "-split"
	cfg.Runner = filepath.Join(b.dir, "runner")
	cfg.Image, cfg.Runtime, cfg.CPUs = b.o.image, b.o.runtime, b.o.cpus
	cfg.MinActive, cfg.MaxSandboxes, cfg.MaxSessions = 0, 1, 0
	cfg.Prestart = prestart
	a, err := agentd.New(ctx, cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return run, reset, err
	}
	defer a.Close(context.Background())
	sb, err := a.Pool().Acquire(ctx, 0)
	if err != nil {
		return run, reset, err
	}
	defer a.Pool().Release(ctx, sb, false)
	usage := func() time.Duration {
		data, err := os.ReadFile("/sys/fs/cgroup/cpuacct/docker/" + sb.ID() + "/cpuacct.usage")
		if err != nil {
			return 0
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		return time.Duration(n)
	}
	r := &runnerv1.Run{Language: lang, Code: code, Timeout: durationpb.New(10 * time.Second), OutputLimit: 1 << 20}
	const n = 20
	for i := range n + 2 {
		c0, t0 := usage(), time.Now()
		if _, err := sb.Run(ctx, r, nil, nil); err != nil {
			return run, reset, err
		}
		c1, t1 := usage(), time.Now()
		if err := sb.Reset(ctx); err != nil {
			return run, reset, err
		}
		c2, t2 := usage(), time.Now()
		if i < 2 {
			continue // warm-up
		}
		run.wall, run.cpu = run.wall+t1.Sub(t0), run.cpu+c1-c0
		reset.wall, reset.cpu = reset.wall+t2.Sub(t1), reset.cpu+c2-c1
	}
	run.wall, run.cpu, reset.wall, reset.cpu = run.wall/n, run.cpu/n, reset.wall/n, reset.cpu/n
	if data, err := os.ReadFile("/sys/fs/cgroup/memory/docker/" + sb.ID() + "/memory.usage_in_bytes"); err == nil {
		reset.memory, _ = strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	}
	return run, reset, nil
}

// cpuUse is CPU time used by the agent's sandboxes, the agent process and
// the container engine.
type cpuUse struct{ sandboxes, agent, engine time.Duration }

func (u cpuUse) sub(before cpuUse, runs int) cpuUse {
	n := time.Duration(max(runs, 1))
	return cpuUse{(u.sandboxes - before.sandboxes) / n, (u.agent - before.agent) / n, (u.engine - before.engine) / n}
}

// cpu reads CPU time so far: the cgroup (v1) accounting of the agent's
// containers, and /proc for the agent and the engine's processes. It is
// best effort: what cannot be read counts as zero.
func (b *bench) cpu(ctx context.Context) cpuUse {
	var u cpuUse
	list, err := b.docker.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", "codemode.agent="+b.name))})
	if err == nil {
		for _, c := range list {
			data, err := os.ReadFile("/sys/fs/cgroup/cpuacct/docker/" + c.ID + "/cpuacct.usage")
			if err == nil {
				n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
				u.sandboxes += time.Duration(n)
			}
		}
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		data, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		st := string(data)
		open, closing := strings.IndexByte(st, '('), strings.LastIndexByte(st, ')')
		if open < 0 || closing < open {
			continue
		}
		comm := st[open+1 : closing]
		fields := strings.Fields(st[closing+1:])
		if len(fields) < 13 {
			continue
		}
		ut, _ := strconv.ParseInt(fields[11], 10, 64)
		stt, _ := strconv.ParseInt(fields[12], 10, 64)
		t := time.Duration(ut+stt) * 10 * time.Millisecond // USER_HZ is 100 on Linux
		pid, _ := strconv.Atoi(filepath.Base(d))
		switch {
		case pid == b.agent.cmd.Process.Pid:
			u.agent += t
		case comm == "dockerd" || comm == "containerd" || strings.HasPrefix(comm, "containerd-shim"):
			u.engine += t
		}
	}
	return u
}

func (b *bench) addRow(name string, conc int, lat []time.Duration, elapsed time.Duration) {
	r := row{name: name, conc: conc, p50: percentile(lat, 50), p95: percentile(lat, 95), p99: percentile(lat, 99), n: len(lat)}
	if elapsed > 0 {
		r.rate = float64(len(lat)) / elapsed.Seconds()
	} else {
		var sum time.Duration
		for _, l := range lat {
			sum += l
		}
		r.rate = float64(len(lat)) / sum.Seconds()
	}
	b.rows = append(b.rows, r)
}

func (b *bench) printTable() {
	fmt.Fprintf(b.out, "\nruntime %s, image %s, %.2g CPUs per sandbox (agent and baseline alike), host CPUs %d\n", b.o.runtime, b.o.image, b.o.cpus, runtime.NumCPU())
	w := len("measurement")
	for _, r := range b.rows {
		w = max(w, len(r.name))
	}
	fmt.Fprintf(b.out, "%-*s %4s %5s %9s %9s %9s %9s\n", w, "measurement", "conc", "n", "p50 ms", "p95 ms", "p99 ms", "per s")
	for _, r := range b.rows {
		if r.noPercents {
			p50 := "-"
			if r.p50 > 0 {
				p50 = fmt.Sprintf("%.1f", ms(r.p50))
			}
			fmt.Fprintf(b.out, "%-*s %4d %5d %9s %9s %9s %9.1f\n", w, r.name, r.conc, r.n, p50, "-", "-", r.rate)
			continue
		}
		fmt.Fprintf(b.out, "%-*s %4d %5d %9.1f %9.1f %9.1f %9.1f\n", w, r.name, r.conc, r.n, ms(r.p50), ms(r.p95), ms(r.p99), r.rate)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func percentile(lat []time.Duration, p int) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}

// startAgent starts the agent binary on a loopback port and returns its URL.
func (b *bench) startAgent(ctx context.Context, name string, extra ...string) (*agentProc, error) {
	args := []string{
		"--addr", "127.0.0.1:0", "--name", name, "--min-active", strconv.Itoa(b.o.warm),
		"--max-sandboxes", strconv.Itoa(b.o.warm + 4), "--image", b.o.image, "--runtime", b.o.runtime, "--cpus", strconv.FormatFloat(b.o.cpus, 'f', -1, 64),
		"--log-format", "json", "--log-level", "info",
	}
	cmd := exec.CommandContext(ctx, filepath.Join(b.dir, "agent"), append(args, extra...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = time.Minute
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	a := &agentProc{cmd: cmd, errc: make(chan error, 1)}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			var rec struct {
				Msg, Addr, Level string
			}
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "listening" {
				addrc <- rec.Addr
			} else if rec.Level == "WARN" || rec.Level == "ERROR" {
				fmt.Fprintf(b.log, "agent: %s\n", sc.Text())
			}
		}
	}()
	go func() { a.errc <- cmd.Wait() }()
	select {
	case addr := <-addrc:
		a.url = "http://" + addr
		return a, nil
	case err := <-a.errc:
		return nil, fmt.Errorf("agent exited: %v", err)
	case <-time.After(time.Minute):
		a.stop()
		return nil, errors.New("agent did not listen within a minute")
	}
}

func waitWarm(ctx context.Context, c agentv1connect.AgentServiceClient, n int) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		st, err := c.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
		if err == nil && int(st.Msg.GetStatus().GetWarm()) >= n {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("fewer than %d warm sandboxes after 5 minutes", n)
}

// rssOf returns the resident set size of process pid.
func rssOf(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no VmRSS")
}

// agentRuns runs e n times through the API with conc workers; it fails on
// any RPC error or a failed program.
func (b *bench) agentRuns(ctx context.Context, c agentv1connect.AgentServiceClient, e *executionv1.Execution, conc, n int) ([]time.Duration, time.Duration, error) {
	for range 3 { // warm-up
		if _, err := c.Execute(ctx, connect.NewRequest(&agentv1.ExecuteRequest{Execution: e})); err != nil {
			return nil, 0, err
		}
	}
	var (
		mu    sync.Mutex
		lat   []time.Duration
		first error
		next  = make(chan struct{}, n)
		wg    sync.WaitGroup
	)
	for range n {
		next <- struct{}{}
	}
	close(next)
	t0 := time.Now()
	for range conc {
		wg.Go(func() {
			for range next {
				d, err := timedRun(ctx, c, e)
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return lat, time.Since(t0), first
}

// pace is the gap between the runs of the paced rows: a caller that thinks
// between runs, as an agent does, rather than a closed loop, in which every
// run competes for the CPU with the scrub (and prestart) of the one before.
const pace = 500 * time.Millisecond

// pacedRows measures one stateless run every pace through c, in Python and
// in JavaScript, adds the rows (their names end with suffix) and returns the
// p50s by language.
func (b *bench) pacedRows(ctx context.Context, c agentv1connect.AgentServiceClient, suffix string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, tc := range []struct{ lang, code string }{{"python", "print(1)"}, {"javascript", "console.log(1)"}} {
		name := fmt.Sprintf("agent stateless %s %s, one every %v%s", tc.lang, tc.code, pace, suffix)
		b.logf("%s", name)
		n := max(b.o.n/4, 10)
		lat, elapsed, err := b.pacedRuns(ctx, c, &executionv1.Execution{Language: tc.lang, Code: tc.code}, n)
		if err != nil {
			return nil, err
		}
		b.addRow(name, 1, lat, elapsed)
		out[tc.lang] = percentile(lat, 50)
	}
	return out, nil
}

// pacedRuns starts one run every pace, each after the one before has
// ended, n times after a warm-up.
func (b *bench) pacedRuns(ctx context.Context, c agentv1connect.AgentServiceClient, e *executionv1.Execution, n int) ([]time.Duration, time.Duration, error) {
	var lat []time.Duration
	t0 := time.Now()
	for i := range n + 3 {
		select {
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		case <-time.After(pace):
		}
		d, err := timedRun(ctx, c, e)
		if err != nil {
			return nil, 0, err
		}
		if i >= 3 { // warm-up
			lat = append(lat, d)
		}
	}
	return lat, time.Since(t0), nil
}

// timedRun runs e once and returns how long the call took; a run that
// does not exit 0 is an error.
func timedRun(ctx context.Context, c agentv1connect.AgentServiceClient, e *executionv1.Execution) (time.Duration, error) {
	s := time.Now()
	res, err := c.Execute(ctx, connect.NewRequest(&agentv1.ExecuteRequest{Execution: e}))
	d := time.Since(s)
	if err == nil && res.Msg.GetResult().GetExitCode() != 0 {
		err = fmt.Errorf("exit %d: %s", res.Msg.GetResult().GetExitCode(), res.Msg.GetResult().GetStderr())
	}
	return d, err
}

// startBaseline starts a runsc container from the same image with a
// long sleep as its entry process, without a CPU limit.
func (b *bench) startBaseline(ctx context.Context) error {
	created, err := b.docker.ContainerCreate(ctx,
		&container.Config{Image: b.o.image, Entrypoint: []string{"sleep", "3600"}, Labels: map[string]string{"codemode.bench": "1"}},
		&container.HostConfig{Runtime: b.o.runtime, NetworkMode: "none", ReadonlyRootfs: true,
			Tmpfs: map[string]string{"/tmp": "size=16m"}, Resources: container.Resources{Memory: 512 << 20, NanoCPUs: int64(b.o.cpus * 1e9)}},
		nil, nil, "")
	if err != nil {
		return err
	}
	b.baseline = created.ID
	return b.docker.ContainerStart(ctx, created.ID, container.StartOptions{})
}

// execIn runs argv in the baseline container through the Engine API and
// returns its stdout.
func (b *bench) execIn(ctx context.Context, argv ...string) (string, error) {
	ex, err := b.docker.ContainerExecCreate(ctx, b.baseline, container.ExecOptions{Cmd: argv, AttachStdout: true, AttachStderr: true})
	if err != nil {
		return "", err
	}
	hj, err := b.docker.ContainerExecAttach(ctx, ex.ID, container.ExecAttachOptions{})
	if err != nil {
		return "", err
	}
	defer hj.Close()
	var out, errb strings.Builder
	if _, err := stdcopy.StdCopy(&out, &errb, hj.Reader); err != nil {
		return "", err
	}
	info, err := b.docker.ContainerExecInspect(ctx, ex.ID)
	if err != nil {
		return "", err
	}
	if info.ExitCode != 0 {
		return "", fmt.Errorf("%q exited %d: %s", argv, info.ExitCode, errb.String())
	}
	return out.String(), nil
}

func (b *bench) dockerExec(ctx context.Context, n int) ([]time.Duration, error) {
	if _, err := b.execIn(ctx, "python3", "-c", "print(1)"); err != nil { // warm-up
		return nil, err
	}
	var lat []time.Duration
	for range n {
		t0 := time.Now()
		out, err := b.execIn(ctx, "python3", "-c", "print(1)")
		if err != nil {
			return nil, err
		}
		if out != "1\n" {
			return nil, fmt.Errorf("docker exec printed %q", out)
		}
		lat = append(lat, time.Since(t0))
	}
	return lat, nil
}

// inSandboxLoop times loops of `python3 -c 'print(1)'` inside the baseline
// sandbox: with loops=1 it returns the time of one start, otherwise the time
// all loops take divided by the starts of one loop.
func (b *bench) inSandboxLoop(ctx context.Context, loops int) (time.Duration, error) {
	script := fmt.Sprintf(`one() { for i in $(seq 1 %d); do python3 -c 'print(1)' >/dev/null; done; }
one # warm-up
s=$(date +%%s%%N)
for j in $(seq 1 %d); do one & done; wait
e=$(date +%%s%%N)
echo $(( (e - s) / %d ))`, b.o.loopN, loops, b.o.loopN)
	out, err := b.execIn(ctx, "sh", "-c", script)
	if err != nil {
		return 0, err
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("loop printed %q", out)
	}
	return time.Duration(ns), nil
}

func (b *bench) cleanup() {
	b.agent.stop()
	b.cold.stop()
	if b.docker != nil && b.baseline != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		b.docker.ContainerRemove(ctx, b.baseline, container.RemoveOptions{Force: true})
		cancel()
	}
	if b.docker != nil {
		b.docker.Close()
	}
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}
