package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/codemode-go/codemode/agent/internal/sandbox"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
)

// workloadItems is the code models send: what imports nothing, and what
// imports the libraries a preloaded parent holds.
var workloadItems = []struct{ name, lang, code string }{
	{"python print(1)", "python", "print(1)"},
	{"requests: prepared request", "python", "import requests\nr = requests.Request('GET', 'http://127.0.0.1/x', params={'q': 1}).prepare()\nprint(r.url)"},
	{"numpy: 500x500 product, eigenvalues", "python", "import numpy as np\na = np.random.rand(500, 500)\nb = a @ a\nprint(np.linalg.eigvals(b)[:1].real)"},
	{"pandas: 10,000 rows, groupby, describe", "python", "import numpy as np, pandas as pd\ndf = pd.DataFrame({'k': np.random.randint(0, 10, 10000), 'v': np.random.rand(10000)})\nprint(df.groupby('k').v.describe().shape)"},
	{"matplotlib: line plot and histogram saved", "python", "import numpy as np, matplotlib.pyplot as plt\nfig, (a, b) = plt.subplots(1, 2)\na.plot(np.arange(100) ** 0.5)\nb.hist(np.random.randn(1000), bins=30)\nfig.savefig('/workspace/outputs/plot.png')"},
	{"javascript console.log(1)", "javascript", "console.log(1)"},
}

// workloadResult is one item on one agent, three ways.
type workloadResult struct {
	paced, c1, c4 runs
	cpu4          time.Duration // host CPU per run at concurrency 4
}

// measureWorkload runs workloadItems stateless on two agents, one with
// --preload=default and one without (each run's interpreter started
// fresh), in turns: paced, closed at concurrency 1 and 4.
func (b *bench) measureWorkload(ctx context.Context) error {
	type agentUnder struct {
		name   string
		client agentv1connect.AgentServiceClient
		mem    int64
	}
	var agents []*agentUnder
	for _, a := range []struct{ suffix, flag string }{{"-fresh", "--preload="}, {"-preload", "--preload=default"}} {
		p, err := b.startAgent(ctx, b.name+a.suffix, a.flag)
		if err != nil {
			return err
		}
		if a.suffix == "-fresh" {
			b.cold = p
		} else {
			b.agent = p
		}
		c := agentv1connect.NewAgentServiceClient(server.NewClient(), p.URL())
		b.logf("agent %s: waiting for %d warm sandboxes", a.suffix, b.o.warm)
		if err := waitWarm(ctx, c, b.o.warm); err != nil {
			return err
		}
		time.Sleep(2 * time.Second)
		agents = append(agents, &agentUnder{name: b.name + a.suffix, client: c})
	}
	for _, a := range agents {
		a.mem = b.sandboxMemory(ctx, a.name)
	}
	results := make([][2]workloadResult, len(workloadItems))
	for i, it := range workloadItems {
		e := &executionv1.Execution{Language: it.lang, Code: it.code}
		for j, a := range agents {
			var r workloadResult
			var err error
			b.logf("%s on %s: paced", it.name, a.name)
			if r.paced, err = b.pacedRuns(ctx, a.client, e, max(b.o.n/2, 10)); err != nil {
				return fmt.Errorf("%s: %w", it.name, err)
			}
			b.logf("%s on %s: concurrency 1", it.name, a.name)
			if r.c1, err = b.closedLoop(ctx, a.client, e, 1, b.o.n); err != nil {
				return fmt.Errorf("%s: %w", it.name, err)
			}
			b.logf("%s on %s: concurrency 4", it.name, a.name)
			before := b.cpu()
			if r.c4, err = b.closedLoop(ctx, a.client, e, 4, b.o.n); err != nil {
				return fmt.Errorf("%s: %w", it.name, err)
			}
			r.cpu4 = (b.cpu().host - before.host) / time.Duration(b.o.n+3)
			results[i][j] = r
		}
	}
	printWorkload(b.out, results, agents[0].mem, agents[1].mem, b.o.warm)
	return nil
}

// sandboxMemory sums the memory the agent's sandboxes use (cgroup v1).
func (b *bench) sandboxMemory(ctx context.Context, agent string) int64 {
	list, err := b.docker.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", sandbox.LabelAgent+"="+agent))})
	if err != nil {
		return 0
	}
	var sum int64
	for _, c := range list {
		data, err := os.ReadFile("/sys/fs/cgroup/memory/docker/" + c.ID + "/memory.usage_in_bytes")
		if err != nil {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		sum += n
	}
	return sum
}

func printWorkload(w io.Writer, res [][2]workloadResult, memFresh, memPreload int64, warm int) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d.Microseconds())/1000) }
	fmt.Fprintf(w, "\nWorkload, stateless, each on an agent without preloading (fresh) and one with --preload=default (preload)\n\n")
	fmt.Fprintf(w, "| item | agent | paced p50 | c1 p50 / p95 / p99 ms | c1 runs/s | c4 p50 / p99 ms | c4 runs/s | c4 host CPU/run ms | c1 p50 ratio | paced p50 ratio | c4 runs/s ratio |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for i, it := range workloadItems {
		for j, name := range []string{"fresh", "preload"} {
			r := res[i][j]
			ratio := ""
			if j == 1 {
				f := res[i][0]
				ratio = fmt.Sprintf("%.2fx | %.2fx | %.2fx", float64(r.c1.p50())/float64(f.c1.p50()), float64(r.paced.p50())/float64(f.paced.p50()), r.c4.rate()/f.c4.rate())
			} else {
				ratio = " | | "
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s / %s / %s | %.1f | %s / %s | %.1f | %s | %s |\n", it.name, name,
				ms(r.paced.p50()), ms(r.c1.p50()), ms(r.c1.p(95)), ms(r.c1.p(99)), r.c1.rate(),
				ms(r.c4.p50()), ms(r.c4.p(99)), r.c4.rate(), ms(r.cpu4), ratio)
		}
	}
	fmt.Fprintf(w, "\nMemory of the %d warm sandboxes (cgroup): %.0f MiB fresh, %.0f MiB preload\n", warm, float64(memFresh)/(1<<20), float64(memPreload)/(1<<20))
}
