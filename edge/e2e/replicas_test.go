package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
	"github.com/codemode-go/codemode/internal/testkit/redistest"
)

// replicas is one agent, two control planes sharing a real Redis, and two
// edges each listing both control planes (in opposite orders), all real
// processes on loopback.
type replicas struct {
	secret   string
	redis    *redistest.Server
	agent    *Process
	cps      [2]*Process
	cpAddrs  [2]string // kept to restart a control plane where it was
	edges    [2]*Process
	agentArg []string
}

func startReplicas(t *testing.T) *replicas {
	t.Helper()
	dockertest.Need(t)
	r := &replicas{secret: newSecret(), redis: redistest.Start(t)}
	t.Cleanup(func() {
		for _, p := range append(r.edges[:], append(r.cps[:], r.agent)...) {
			if p != nil {
				_ = p.Stop(30 * time.Second)
			}
		}
		if t.Failed() {
			t.Log(r.logs())
		}
	})
	for i := range r.cps {
		if err := r.startControlPlane(i, "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		r.cpAddrs[i] = r.cps[i].Addr
	}
	name := fmt.Sprintf("e2e-replicas-%d", os.Getpid())
	state, err := os.MkdirTemp(binDir, "agent-state-")
	if err != nil {
		t.Fatal(err)
	}
	r.agent, err = start("agent", r.env(), "--addr", "127.0.0.1:0", "--name", name, "--runner", filepath.Join(binDir, "runner"),
		"--state-dir", state, "--controlplanes", r.cps[0].URL()+","+r.cps[1].URL(), "--heartbeat-interval", "500ms",
		"--min-active", "2", "--max-sessions", "8", "--max-sessions-per-tenant", "8")
	if err != nil {
		t.Fatal(err)
	}
	for i, order := range [][2]int{{0, 1}, {1, 0}} {
		r.edges[i], err = start("edge", append(r.env(), "CODE_EXECUTION_HOST="+r.cps[order[0]].URL()+","+r.cps[order[1]].URL()), "--addr", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range r.cps {
		r.waitAgent(t, i)
	}
	return r
}

func (r *replicas) env() []string {
	return []string{"CODEMODE_CLUSTER_SECRET=" + r.secret}
}

func (r *replicas) startControlPlane(i int, addr string) error {
	// The URL holds Redis's password: in the environment, not on the command line.
	p, err := start("controlplane", append(r.env(), "REDIS_URL="+r.redis.URL), "--addr", addr, "--agents=", "--poll-interval", "200ms")
	if err != nil {
		return err
	}
	r.cps[i] = p
	return nil
}

func (r *replicas) cp(i int) controlplanev1connect.ControlPlaneServiceClient {
	c := server.NewClient()
	c.Transport = bearerTransport{secret: r.secret, base: c.Transport}
	return controlplanev1connect.NewControlPlaneServiceClient(c, "http://"+r.cpAddrs[i])
}

func (r *replicas) edge(i int) edgev1connect.ExecutionServiceClient {
	return edgev1connect.NewExecutionServiceClient(server.NewClient(), r.edges[i].URL())
}

// waitAgent waits until control plane i routes to the agent.
func (r *replicas) waitAgent(t *testing.T, i int) {
	t.Helper()
	testkit.Eventually(t, 2*time.Minute, func() error {
		res, err := r.cp(i).ListAgents(t.Context(), connect.NewRequest(&cpv1.ListAgentsRequest{}))
		if err == nil && len(res.Msg.GetAgents()) == 1 && res.Msg.GetAgents()[0].GetHealthy() {
			return nil
		}
		return fmt.Errorf("control plane %d: agent not healthy: %v %v", i, res, err)
	})
}

func (r *replicas) logs() string {
	var b strings.Builder
	for _, p := range append(r.edges[:], append(r.cps[:], r.agent)...) {
		if p != nil {
			fmt.Fprintf(&b, "--- %s %s ---\n%s\n", p.Name, p.Addr, p.Logs())
		}
	}
	return b.String()
}

// cpRun runs code in session through control plane i.
func (r *replicas) cpRun(ctx context.Context, i int, session, code string) (*executionv1.Result, error) {
	res, err := r.cp(i).Execute(ctx, connect.NewRequest(&cpv1.ExecuteRequest{Tenant: "t1",
		Execution: &executionv1.Execution{Language: "python", Code: code, SessionId: session}}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetResult(), nil
}

func TestClusterTwoControlPlanesShareRedis(t *testing.T) {
	r := startReplicas(t)
	ctx := t.Context()

	t.Run("session state through either control plane", func(t *testing.T) {
		sharedSessionState(t, ctx, r)
	})

	t.Run("kill -9 of either control plane under load", func(t *testing.T) {
		const workers = 4
		sessions := make([]string, workers)
		for w := range sessions {
			sessions[w] = fmt.Sprintf("load-%d", w)
			if _, err := r.edge(w%2).Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python",
				Code: fmt.Sprintf("marker = 'm%d'; n = 0\nopen('marker.txt', 'w').write(marker)", w), SessionId: sessions[w]})); err != nil {
				t.Fatal(err)
			}
		}
		// Quiet sessions run nothing while control planes die and come
		// back: their bindings live only in Redis, and their variables
		// must be there afterwards.
		quiet := []string{"quiet-0", "quiet-1"}
		for i, id := range quiet {
			if _, err := r.edge(i).Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python",
				Code: fmt.Sprintf("q = 'q%d'", i), SessionId: id})); err != nil {
				t.Fatal(err)
			}
		}
		attempts := make([]int, workers) // session runs sent, per session
		successes := make([]int, workers)
		interrupted := make([]bool, workers) // a session run failed
		for round, victim := range []int{0, 1} {
			r.killUnderLoad(t, ctx, round, victim, sessions, attempts, successes, interrupted)
		}
		// Every session still holds its state, through either control
		// plane: an edge that knows only that one asks.
		r.checkSessionsKept(t, ctx, quiet, sessions, attempts, successes, interrupted)
	})
}

// sharedSessionState is "session state through either control plane": a
// session's variables and files written through one are there through the other,
// and closed through one it is closed through the other.
func sharedSessionState(t *testing.T, ctx context.Context, r *replicas) {
	if _, err := r.cpRun(ctx, 0, "shared-1", "x = 41"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.cp(0).WriteFile(ctx, connect.NewRequest(&cpv1.WriteFileRequest{Tenant: "t1", SessionId: "shared-1",
		File: &executionv1.File{Path: "note.txt", Content: []byte("written through A")}})); err != nil {
		t.Fatal(err)
	}
	res, err := r.cpRun(ctx, 1, "shared-1", "print(x + 1)")
	if err != nil || strings.TrimSpace(res.GetStdout()) != "42" {
		t.Fatalf("through B: %v %v, want 42", res, err)
	}
	f, err := r.cp(1).ReadFile(ctx, connect.NewRequest(&cpv1.ReadFileRequest{Tenant: "t1", SessionId: "shared-1", Path: "note.txt"}))
	if err != nil || string(f.Msg.GetFile().GetContent()) != "written through A" {
		t.Fatalf("file through B: %v %v", f, err)
	}
	if _, err := r.cp(0).CloseSession(ctx, connect.NewRequest(&cpv1.CloseSessionRequest{Tenant: "t1", SessionId: "shared-1"})); err != nil {
		t.Fatal(err)
	}
	_, err = r.cpRun(ctx, 1, "shared-1", "print(x)")
	if connect.CodeOf(err) != connect.CodeNotFound || testkit.ErrorDetail[*executionv1.SessionNotFound](err).GetReason() != executionv1.SessionNotFound_REASON_CLOSED {
		t.Fatalf("a session closed through A, run through B: %v, want not_found, closed", err)
	}
}

// killUnderLoad is a round of "kill -9 of either control plane under load":
// runs from workers at once through both edges, control plane victim killed
// once they are under way, then started again where it was.
func (r *replicas) killUnderLoad(t *testing.T, ctx context.Context, round, victim int, sessions []string, attempts, successes []int, interrupted []bool) {
	workers := len(sessions)
	var done, afterKill atomic.Int64
	var killed atomic.Bool
	var mu sync.Mutex
	var failures []error
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range 16 {
				c := r.edge((w + i) % 2)
				req := &edgev1.ExecuteRequest{Language: "python", Code: "print(1)"}
				if i%2 == 0 {
					req = &edgev1.ExecuteRequest{Language: "python", Code: "n = globals().get('n', 0) + 1\nprint(n)", SessionId: sessions[w]}
					attempts[w]++
				}
				rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				res, err := c.Execute(rctx, connect.NewRequest(req))
				cancel()
				if err != nil {
					interrupted[w] = interrupted[w] || req.SessionId != ""
					mu.Lock()
					failures = append(failures, fmt.Errorf("worker %d run %d (session %q): %w", w, i, req.SessionId, err))
					mu.Unlock()
					continue
				}
				if res.Msg.GetResult().GetExitCode() != 0 {
					t.Errorf("worker %d run %d: %v", w, i, res.Msg.GetResult())
				}
				if req.SessionId != "" {
					successes[w]++
				}
				done.Add(1)
				if killed.Load() {
					afterKill.Add(1)
				}
			}
		})
	}
	// Kill the victim once the load is under way.
	testkit.Until(time.Minute, func() bool { return done.Load() >= 8 })
	r.cps[victim].Kill()
	killed.Store(true)
	wg.Wait()
	for _, err := range failures {
		// A run in flight on the killed control plane may fail,
		// clearly; none may hang past its deadline.
		if code := connect.CodeOf(err); code != connect.CodeUnavailable {
			t.Errorf("round %d: %v: want unavailable or success", round, err)
		}
	}
	if afterKill.Load() == 0 {
		t.Fatalf("round %d: no run succeeded after control plane %d was killed", round, victim)
	}
	t.Logf("round %d: control plane %d killed; %d runs succeeded (%d after the kill), %d failed clearly",
		round, victim, done.Load(), afterKill.Load(), len(failures))
	// It comes back where it was, with nothing but Redis to go on.
	if err := r.startControlPlane(victim, r.cpAddrs[victim]); err != nil {
		t.Fatal(err)
	}
	r.waitAgent(t, victim)
}

// checkSessionsKept checks, through each control plane by an edge that knows
// only that one, that the quiet sessions kept their variables and the loaded
// sessions their files and their count of runs.
func (r *replicas) checkSessionsKept(t *testing.T, ctx context.Context, quiet, sessions []string, attempts, successes []int, interrupted []bool) {
	for i := range r.cps {
		e, err := start("edge", append(r.env(), "CODE_EXECUTION_HOST="+r.cps[i].URL()), "--addr", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer e.Stop(10 * time.Second)
		c := edgev1connect.NewExecutionServiceClient(server.NewClient(), e.URL())
		for k, id := range quiet {
			out, err := c.Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(q)", SessionId: id}))
			if err != nil || strings.TrimSpace(out.Msg.GetResult().GetStdout()) != fmt.Sprintf("q%d", k) {
				t.Fatalf("quiet session %s through control plane %d: %v %v", id, i, out, err)
			}
		}
		for w, id := range sessions {
			// The session is there, with its files.
			out, err := c.Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(open('marker.txt').read())", SessionId: id}))
			if err != nil {
				t.Fatalf("session %s through control plane %d: %v", id, i, err)
			}
			if got := strings.TrimSpace(out.Msg.GetResult().GetStdout()); got != fmt.Sprintf("m%d", w) {
				t.Fatalf("session %s through control plane %d: marker file holds %q", id, i, got)
			}
			out, err = c.Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(marker, n)", SessionId: id}))
			if err != nil {
				t.Fatalf("session %s through control plane %d: %v", id, i, err)
			}
			res := out.Msg.GetResult()
			var marker string
			var n int
			if _, err := fmt.Sscan(res.GetStdout(), &marker, &n); err != nil || marker != fmt.Sprintf("m%d", w) {
				t.Fatalf("session %s through control plane %d printed %q, want its marker", id, i, res.GetStdout())
			}
			// Each run counted once: none ran twice, none was lost. A
			// run cut off by a kill (its caller went away, and the
			// agent interrupted the cell, keeping the session's
			// state) may or may not have counted.
			switch {
			case interrupted[w] && (n < successes[w] || n > attempts[w]):
				t.Errorf("session %s counted %d runs; %d succeeded of %d sent, some cut off", id, n, successes[w], attempts[w])
			case !interrupted[w] && (n != successes[w] || n != attempts[w]):
				t.Errorf("session %s counted %d runs; %d succeeded of %d sent", id, n, successes[w], attempts[w])
			}
		}
	}
}
