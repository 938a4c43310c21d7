package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/agent/internal/agentd"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit/launch"
)

// warmAgent starts the agent measured, waits for its warm sandboxes and
// reads its memory.
func (b *bench) warmAgent(ctx context.Context, r *report) error {
	var err error
	if b.agent, err = b.startAgent(ctx, b.name); err != nil {
		return err
	}
	b.client = agentv1connect.NewAgentServiceClient(server.NewClient(), b.agent.URL())
	b.logf("waiting for %d warm sandboxes", b.o.warm)
	if err := waitWarm(ctx, b.client, b.o.warm); err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // let the start-up garbage be collected
	r.rss, err = rssOf(b.agent.Pid())
	return err
}

// measureAgent measures the agent's API: stateless runs in closed loops,
// a stateful session and paced runs. It stops the agent when done.
func (b *bench) measureAgent(ctx context.Context, r *report) error {
	for _, tc := range []struct {
		name, lang, code string
		conc             int
		into             *runs
	}{
		{"agent stateless python print(1)", "python", "print(1)", 1, &r.python1},
		{"agent stateless python print(1)", "python", "print(1)", 4, &r.python4},
		{"agent stateless bash echo 1", "bash", "echo 1", 1, &r.bash1},
		{"agent stateless bash echo 1", "bash", "echo 1", 4, &r.bash4},
	} {
		b.logf("%s, concurrency %d", tc.name, tc.conc)
		before := b.cpu()
		res, err := b.closedLoop(ctx, b.client, &executionv1.Execution{Language: tc.lang, Code: tc.code}, tc.conc, b.o.n)
		if err != nil {
			return err
		}
		if tc.into == &r.python4 {
			r.cpu = b.cpu().sub(before, len(res.lat)+3)
		}
		*tc.into = res
	}

	b.logf("stateful session")
	sess, err := b.client.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "python"}))
	if err != nil {
		return err
	}
	id := sess.Msg.GetSession().GetId()
	r.stateful, err = b.closedLoop(ctx, b.client, &executionv1.Execution{Language: "python", Code: "x = 1", SessionId: id}, 1, b.o.n)
	if err != nil {
		return err
	}
	b.client.CloseSession(ctx, connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: id}))

	if r.paced, err = b.pacedBoth(ctx, b.client); err != nil {
		return err
	}
	if err := b.measureUnbounded(ctx, r); err != nil {
		return err
	}
	if err := b.agent.Stop(time.Minute); err != nil {
		b.logf("stop agent: %v", err)
	}
	return nil
}

// measureUnbounded measures stateless python at concurrency 4 on the agent
// and on a second one started with --run-slots 0, which admits every run
// at once: two rounds each, in turn, so that both see the same host.
func (b *bench) measureUnbounded(ctx context.Context, r *report) error {
	b.logf("agent stateless python print(1), concurrency 4, against --run-slots 0, in turns")
	var err error
	if b.unbounded, err = b.startAgent(ctx, b.name+"-unbounded", "--run-slots", "0"); err != nil {
		return err
	}
	c := agentv1connect.NewAgentServiceClient(server.NewClient(), b.unbounded.URL())
	if err := waitWarm(ctx, c, b.o.warm); err != nil {
		return err
	}
	e := &executionv1.Execution{Language: "python", Code: "print(1)"}
	for range 2 {
		for _, t := range []struct {
			c    agentv1connect.AgentServiceClient
			into *runs
		}{{b.client, &r.slotted4}, {c, &r.unbounded4}} {
			res, err := b.closedLoop(ctx, t.c, e, 4, b.o.n/2)
			if err != nil {
				return err
			}
			t.into.lat = append(t.into.lat, res.lat...)
			t.into.elapsed += res.elapsed
		}
	}
	if err := b.unbounded.Stop(time.Minute); err != nil {
		b.logf("stop agent: %v", err)
	}
	return nil
}

// measureColdAgent measures stateless runs on a second agent started with
// --prestart=false: the same run's baseline for prestarted interpreters.
func (b *bench) measureColdAgent(ctx context.Context, r *report) error {
	b.logf("agent stateless python print(1), concurrency 1, without prestart")
	var err error
	if b.cold, err = b.startAgent(ctx, b.name+"-cold", "--prestart=false"); err != nil {
		return err
	}
	c := agentv1connect.NewAgentServiceClient(server.NewClient(), b.cold.URL())
	if err := waitWarm(ctx, c, b.o.warm); err != nil {
		return err
	}
	if r.coldPython1, err = b.closedLoop(ctx, c, &executionv1.Execution{Language: "python", Code: "print(1)"}, 1, b.o.n); err != nil {
		return err
	}
	if r.coldPaced, err = b.pacedBoth(ctx, c); err != nil {
		return err
	}
	if err := b.cold.Stop(time.Minute); err != nil {
		b.logf("stop agent: %v", err)
	}
	return nil
}

// startAgent starts the agent binary on a loopback port. The agent's
// warnings and errors are copied to the log as they come.
func (b *bench) startAgent(ctx context.Context, name string, extra ...string) (*launch.Process, error) {
	maxSandboxes := b.o.warm + 4
	// The agent wants no more sessions than sandboxes; the bench opens one.
	maxSessions := min(agentd.DefaultConfig().MaxSessions, maxSandboxes)
	args := []string{
		"--addr", "127.0.0.1:0", "--name", name, "--min-active", strconv.Itoa(b.o.warm),
		"--max-sandboxes", strconv.Itoa(maxSandboxes), "--max-sessions", strconv.Itoa(maxSessions),
		"--image", b.o.image, "--runtime", b.o.runtime, "--cpus", strconv.FormatFloat(b.o.cpus, 'f', -1, 64),
		"--log-format", "json", "--log-level", "info",
	}
	cmd := exec.CommandContext(ctx, filepath.Join(b.dir, "agent"), append(args, extra...)...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = time.Minute
	return launch.Start(ctx, cmd, launch.Options{Name: "agent " + name, Watch: func(line string) {
		var rec struct{ Level string }
		if json.Unmarshal([]byte(line), &rec) == nil && (rec.Level == "WARN" || rec.Level == "ERROR") {
			fmt.Fprintf(b.log, "agent: %s\n", line)
		}
	}})
}

// pacedBoth measures one stateless run every pace through c, in Python and
// in JavaScript.
func (b *bench) pacedBoth(ctx context.Context, c agentv1connect.AgentServiceClient) (paced, error) {
	var p paced
	for _, tc := range []struct {
		lang, code string
		into       *runs
	}{{"python", "print(1)", &p.python}, {"javascript", "console.log(1)", &p.javascript}} {
		b.logf("agent stateless %s %s, one every %v", tc.lang, tc.code, pace)
		res, err := b.pacedRuns(ctx, c, &executionv1.Execution{Language: tc.lang, Code: tc.code}, max(b.o.n/4, 10))
		if err != nil {
			return p, err
		}
		*tc.into = res
	}
	return p, nil
}

// closedLoop runs e n times through the API with conc workers; it fails on
// any RPC error or a failed program.
func (b *bench) closedLoop(ctx context.Context, c agentv1connect.AgentServiceClient, e *executionv1.Execution, conc, n int) (runs, error) {
	for range 3 { // warm-up
		if _, err := c.Execute(ctx, connect.NewRequest(&agentv1.ExecuteRequest{Execution: e})); err != nil {
			return runs{}, err
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
	return runs{lat, time.Since(t0)}, first
}

// pace is the gap between paced runs: a caller that thinks
// between runs, as an agent does, rather than a closed loop, in which every
// run competes for the CPU with the scrub (and prestart) of the one before.
const pace = 500 * time.Millisecond

// pacedRuns starts one run every pace, each after the one before has
// ended, n times after a warm-up.
func (b *bench) pacedRuns(ctx context.Context, c agentv1connect.AgentServiceClient, e *executionv1.Execution, n int) (runs, error) {
	var lat []time.Duration
	t0 := time.Now()
	for i := range n + 3 {
		select {
		case <-ctx.Done():
			return runs{}, ctx.Err()
		case <-time.After(pace):
		}
		d, err := timedRun(ctx, c, e)
		if err != nil {
			return runs{}, err
		}
		if i >= 3 { // warm-up
			lat = append(lat, d)
		}
	}
	return runs{lat, time.Since(t0)}, nil
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

// waitWarm waits, up to 5 minutes, until the agent has n warm sandboxes.
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
