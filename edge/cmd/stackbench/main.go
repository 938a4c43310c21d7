// Command stackbench brings up the whole stack (agent, control plane and
// edge, as processes of their own on loopback ports) and drives the same
// bounded workload through every door of the edge: Connect JSON, gRPC,
// gRPC-Web, MCP (streamable HTTP) and the original's POST /run, and through
// the agent's API directly. Each target is measured at concurrency 1 (a
// closed loop, and paced: one run every 500 ms), 4 and 16, step by step with
// every target in turn within a step; the concurrency 16
// phase runs once more on an edge with the example policy chain
// (policies/build.sh). A mixed workload (70% `echo 1` in bash, 20% a
// CPU-bound Python loop, 10% a long busy loop, in a seeded order) runs
// through Connect at concurrency 4. Baselines measured in the same run:
// `docker exec` into a warm runsc container and interpreter starts inside
// that sandbox (one loop and four parallel loops).
//
// The realistic workload (workload.go) is the code models send, each item
// stateless through the Connect JSON door at concurrency 1 (paced and
// closed) and 4: on this stack, whose agent preloads (--preload=default),
// and on a second stack started for it whose agent does not (--preload=),
// the two in turns. Its table has each item's latency, runs/s and CPU per
// run (the host's and the sandboxes' cgroups'), the memory of both agents
// and their sandboxes, and the ratios of the Targets section.
//
// The TLS part (tls.go) starts two more stacks, one with TLS on every link
// and the client's, one plain, and runs print(1) through both in turns,
// paced; then it times fresh connections to each edge, TLS handshake
// against TCP alone. -only runs one part.
//
// It prints one table (p50, p95, p99, runs/s, errors by kind), the CPU
// each run cost the host and each service (from /proc), the machine's
// description and a Targets section of ratios from the same run;
// with -markdown it writes all of that to a file (BENCHMARKS.md), and with
// -png it draws p50 and p99 latency against concurrency, one line per door
// plus the agent directly.
//
// It builds the binaries from this module into a temporary directory and
// removes every process and container it started when it ends, also on
// error or interrupt. Every loop is bounded. Run it from the repository
// root:
//
//	go run ./edge/cmd/stackbench [-n 100] [-workload-n 12] [-tls-n 60] [-only doors|workload|tls] [-markdown BENCHMARKS.md] [-png BENCHMARKS.png]
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/limits"
)

func main() { cli.Main(run) }

type options struct {
	n        int // runs per closed-loop measurement
	execN    int // docker exec runs of the baseline
	loopN    int // interpreter starts per in-sandbox loop
	warm     int // warm sandboxes of the agent
	image    string
	runtime  string
	queue    time.Duration // the agent's queue timeout
	markdown string        // where to write the report; empty: nowhere
	png      string        // where to draw the plot; empty: nowhere
	seed     int64         // of the mixed workload's order
	// workloadN is the runs per measurement of each item of the
	// realistic workload, per stack.
	workloadN int
	// tlsN is the paced runs through each stack of the TLS part;
	// handshakeN the fresh connections to each of its edges.
	tlsN, handshakeN int
	only             string // "doors", "workload" or "tls": run only that part; "": all
}

// doors, workload and tlsPart say which parts run.
func (o options) doors() bool    { return o.only == "" || o.only == "doors" }
func (o options) workload() bool { return o.only == "" || o.only == "workload" }
func (o options) tlsPart() bool  { return o.only == "" || o.only == "tls" }

func run(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	var o options
	f := cli.NewFlags("stackbench", stderr)
	f.IntVar(&o.n, "n", 100, "runs per measurement (at least twice the concurrency; paced rows: n/4, at least 4)")
	f.IntVar(&o.execN, "exec-n", 30, "docker exec runs for the baseline")
	f.IntVar(&o.loopN, "loop-n", 20, "interpreter starts per loop inside the sandbox")
	f.IntVar(&o.warm, "warm", 4, "warm sandboxes of the agent (its --min-active)")
	f.StringVar(&o.image, "image", limits.SandboxImage, "sandbox image")
	f.StringVar(&o.runtime, "runtime", "runsc", "OCI runtime")
	f.DurationVar(&o.queue, "queue-timeout", limits.QueueTimeout, "the agent's --queue-timeout, the bound of p99 at concurrency 16")
	f.StringVar(&o.markdown, "markdown", "", "write the report to this Markdown file (BENCHMARKS.md)")
	f.StringVar(&o.png, "png", "", "draw latency against concurrency into this PNG file")
	f.Int64Var(&o.seed, "seed", 1, "seed of the mixed workload's order")
	f.IntVar(&o.workloadN, "workload-n", 12, "runs per closed-loop measurement of each item of the realistic workload, per stack (paced and closed; print(1) and console.log(1): three times as many)")
	f.IntVar(&o.tlsN, "tls-n", 60, "paced runs of print(1) through each stack of the TLS part (TLS on every link, and plain)")
	f.IntVar(&o.handshakeN, "handshake-n", 50, "fresh connections to each edge of the TLS part, timing the TLS handshake against TCP alone")
	f.StringVar(&o.only, "only", "", `run only one part: "doors" (every door with print(1), the mixed workload), "workload" (the code models send, with and without preloading) or "tls" (print(1) with TLS on every link against plain TCP, and the handshake's cost); empty: all`)
	for _, name := range []string{"n", "exec-n", "loop-n", "warm", "image", "runtime", "queue-timeout", "markdown", "png", "seed", "workload-n", "tls-n", "handshake-n", "only"} {
		f.Env(name, "STACKBENCH_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_")))
	}
	if err := f.Parse(args, os.Getenv); err != nil {
		return err
	}
	if o.n < 4 || o.n > 10000 || o.execN < 5 || o.execN > 1000 || o.loopN < 5 || o.loopN > 500 || o.warm < 1 || o.warm > 16 ||
		o.workloadN < 8 || o.workloadN > 1000 || o.tlsN < 10 || o.tlsN > 1000 || o.handshakeN < 5 || o.handshakeN > 1000 {
		return errors.New("bounds: -n 4..10000, -exec-n 5..1000, -loop-n 5..500, -warm 1..16, -workload-n 8..1000, -tls-n 10..1000, -handshake-n 5..1000")
	}
	if o.only != "" && o.only != "doors" && o.only != "workload" && o.only != "tls" {
		return fmt.Errorf("-only %q: want doors, workload, tls or nothing", o.only)
	}
	ctx, cancel := context.WithTimeout(ctx, 45*time.Minute)
	defer cancel()
	b := &bench{o: o, out: stdout, log: stderr, cmdline: "go run ./edge/cmd/stackbench " + strings.Join(args, " ")}
	defer b.cleanup()
	return b.run(ctx)
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.log, "stackbench: "+format+"\n", args...)
}
