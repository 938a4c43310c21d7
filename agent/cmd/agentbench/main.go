// Command agentbench measures the agent against its baselines in one run and
// prints a table: stateless runs through the agent's API at concurrency 1
// and 4 and paced (one run every 500ms), `docker exec` on a warm runsc
// container, Python start time inside a runsc sandbox (one loop and four
// parallel loops), a trivial statement in a stateful session, the runner's
// run and scrub in one sandbox, the agent's own memory with 8 warm
// sandboxes, and, as the same run's baseline for prestarted interpreters,
// stateless runs on a second agent started with --prestart=false. It ends
// with the targets (see targets in report.go), each marked met or MISSED;
// a missed target does not change its exit status.
//
// It builds the agent and the runner from this module, starts the agent as
// a process on a loopback port, and removes everything it started when it
// ends. Every loop is bounded. Run it from the repository root:
//
//	go run ./agent/cmd/agentbench [-n 100]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"github.com/docker/docker/client"

	"github.com/codemode-go/codemode/agent/internal/agentd"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/limits"
	"github.com/codemode-go/codemode/internal/testkit/benchbase"
	"github.com/codemode-go/codemode/internal/testkit/launch"
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
	// workload measures only the workload of code that imports
	// libraries, with and without a preloaded parent (see workload.go).
	workload bool
}

func run(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	var o options
	f := flag.NewFlagSet("agentbench", flag.ContinueOnError)
	f.SetOutput(stderr)
	f.IntVar(&o.n, "n", 100, "runs per agent measurement")
	f.IntVar(&o.execN, "exec-n", 30, "docker exec runs for the baseline")
	f.IntVar(&o.loopN, "loop-n", 20, "interpreter starts per loop inside the sandbox")
	f.IntVar(&o.warm, "warm", 8, "warm sandboxes of the agent (its memory is measured with them)")
	f.StringVar(&o.image, "image", limits.SandboxImage, "sandbox image")
	f.StringVar(&o.runtime, "runtime", "runsc", "OCI runtime")
	f.Float64Var(&o.cpus, "cpus", agentd.DefaultConfig().CPUs, "CPU limit of the agent's sandboxes and of the baseline container alike (the agent's default; both are pinned to CPUs as the agent pins)")
	f.BoolVar(&o.workload, "workload", false, "measure only the workload of code that imports libraries (requests, numpy, pandas, matplotlib) on an agent with --preload=default and one without")
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
	o         options
	out, log  io.Writer
	dir       string // the binaries built
	docker    *client.Client
	baseline  *benchbase.Baseline               // the baseline container, once started
	name      string                            // of the agent
	agent     *launch.Process                   // the agent measured
	client    agentv1connect.AgentServiceClient // of agent
	cold      *launch.Process                   // one whose runners prestart no interpreter
	unbounded *launch.Process                   // one without run slots (--run-slots 0)
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "agentbench: "+format+"\n", args...)
}

// run measures in phases, each filling in its part of the report, and
// prints the report.
func (b *bench) run(ctx context.Context) error {
	if err := b.setup(ctx); err != nil {
		return err
	}
	if b.o.workload {
		return b.measureWorkload(ctx)
	}
	r := &report{o: b.o}
	for _, phase := range []func(context.Context, *report) error{
		b.warmAgent,        // the agent, its memory once warm
		b.baselines,        // docker exec and interpreter starts in a warm runsc container
		b.measureSplit,     // the runner's run and scrub in one sandbox
		b.measureAgent,     // the agent's API
		b.measureColdAgent, // a second agent, without prestarted interpreters
	} {
		if err := phase(ctx, r); err != nil {
			return err
		}
	}
	r.print(b.out)
	return nil
}

// setup connects to Docker and builds the agent and the runner.
func (b *bench) setup(ctx context.Context) error {
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
	b.name = fmt.Sprintf("bench-%d", os.Getpid())
	return nil
}

func (b *bench) cleanup() {
	for _, p := range []*launch.Process{b.agent, b.cold, b.unbounded} {
		if p != nil {
			_ = p.Stop(time.Minute) // it removes its sandboxes
		}
	}
	if b.baseline != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = b.baseline.Remove(ctx)
		cancel()
	}
	if b.docker != nil {
		b.docker.Close()
	}
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}
