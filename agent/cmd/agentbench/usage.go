package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/agent/internal/agentd"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	"github.com/codemode-go/codemode/internal/testkit/benchbase"
)

// measureSplit measures the runner's split (see runnerSplit).
func (b *bench) measureSplit(ctx context.Context, r *report) error {
	b.logf("runner run and scrub, one sandbox")
	var err error
	r.split, err = b.runnerSplit(ctx)
	return err
}

// splitRow is one line of the runner's split: the mean of a step.
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
		d, _ := benchbase.ContainerCPU(sb.ID())
		return d
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
	reset.memory = benchbase.ContainerMemory(sb.ID())
	return run, reset, nil
}

// cpuUse is CPU time used by the agent's sandboxes, the agent process and
// the container engine, and the whole host's busy time (which also counts
// gVisor's work outside the sandboxes' cgroups, and anything else running).
type cpuUse struct{ sandboxes, agent, engine, host time.Duration }

// sub returns the use since before, per run of n.
func (u cpuUse) sub(before cpuUse, n int) cpuUse {
	d := time.Duration(max(n, 1))
	return cpuUse{(u.sandboxes - before.sandboxes) / d, (u.agent - before.agent) / d, (u.engine - before.engine) / d, (u.host - before.host) / d}
}

// cpu reads CPU time so far: the cgroup (v1) accounting of the engine's
// containers, and /proc for the agent and the engine's processes. It is
// best effort: what cannot be read counts as zero.
//
// The containers' figure is their parent cgroup's, which keeps what a
// container used after it is removed: the pool replaces sandboxes during a
// measurement (each serves at most --max-reuse runs), and a sum over the
// containers alive at its start and end would lose whatever the replaced ones
// used. The only other container then is the idle baseline.
func (b *bench) cpu() cpuUse {
	var u cpuUse
	u.host, _ = benchbase.HostCPU()
	u.sandboxes, _ = benchbase.ContainersCPU()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		data, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		st, err := benchbase.ParseProcStat(data)
		if err != nil {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		switch {
		case pid == b.agent.Pid():
			u.agent += st.CPU
		case st.Comm == "dockerd" || st.Comm == "containerd" || strings.HasPrefix(st.Comm, "containerd-shim"):
			u.engine += st.CPU
		}
	}
	return u
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
