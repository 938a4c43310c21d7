package controlplaned

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/controlplane/internal/redisstore"
	"github.com/codemode-go/codemode/controlplane/internal/router"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/cluster"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/redistest"
)

// stubAgent stands in for an agent in routing tests: routing depends only on
// what agents report and whether they answer, not on sandboxes, which the
// agent's and the end-to-end tests cover with the real thing.
type stubAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
	name   string
	free   atomic.Int32
	labels map[string]string
	ran    atomic.Int32
	refuse atomic.Bool // turn Execute away (unavailable) before it starts
	dies   atomic.Bool // start Execute, then fail (unavailable) as a dying sandbox does

	mu       sync.Mutex
	sessions map[string]bool
}

func (a *stubAgent) Status(context.Context, *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error) {
	return connect.NewResponse(&agentv1.StatusResponse{Status: &agentv1.AgentStatus{
		Name: a.name, Labels: a.labels, Free: a.free.Load(), Capacity: 8, Ready: true, Runtime: "runsc",
		Languages: []*executionv1.Language{{Name: "python", Version: "3.11"}, {Name: a.name + "-lang"}},
	}}), nil
}

func (a *stubAgent) Execute(_ context.Context, req *connect.Request[agentv1.ExecuteRequest]) (*connect.Response[agentv1.ExecuteResponse], error) {
	if a.refuse.Load() {
		return nil, cluster.MarkNotStarted(connect.NewError(connect.CodeUnavailable, errors.New("engine away")))
	}
	a.ran.Add(1)
	if a.dies.Load() {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the sandbox died during the run"))
	}
	if sid := req.Msg.GetExecution().GetSessionId(); sid != "" {
		a.mu.Lock()
		a.sessions[sid] = true
		a.mu.Unlock()
	}
	return connect.NewResponse(&agentv1.ExecuteResponse{Result: &executionv1.Result{Stdout: a.name, Agent: a.name}}), nil
}

func (a *stubAgent) ExecuteStream(_ context.Context, req *connect.Request[agentv1.ExecuteStreamRequest], st *connect.ServerStream[agentv1.ExecuteStreamResponse]) error {
	if a.refuse.Load() {
		return cluster.MarkNotStarted(connect.NewError(connect.CodeUnavailable, errors.New("engine away")))
	}
	a.ran.Add(1)
	if a.dies.Load() {
		return connect.NewError(connect.CodeUnavailable, errors.New("the sandbox died during the run"))
	}
	for _, ev := range []*executionv1.Event{
		{Event: &executionv1.Event_Stdout{Stdout: a.name}},
		{Event: &executionv1.Event_Result{Result: &executionv1.Result{Agent: a.name}}},
	} {
		if err := st.Send(&agentv1.ExecuteStreamResponse{Event: ev}); err != nil {
			return err
		}
	}
	return nil
}

func (a *stubAgent) CloseSession(_ context.Context, req *connect.Request[agentv1.CloseSessionRequest]) (*connect.Response[agentv1.CloseSessionResponse], error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.sessions[req.Msg.GetSessionId()] {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such session"))
	}
	delete(a.sessions, req.Msg.GetSessionId())
	return connect.NewResponse(&agentv1.CloseSessionResponse{}), nil
}

func (a *stubAgent) GetSession(_ context.Context, req *connect.Request[agentv1.GetSessionRequest]) (*connect.Response[agentv1.GetSessionResponse], error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.sessions[req.Msg.GetSessionId()] {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("no such session"))
	}
	return connect.NewResponse(&agentv1.GetSessionResponse{Session: &executionv1.Session{Id: req.Msg.GetSessionId(), Agent: a.name}}), nil
}

// serveAgent serves a on loopback until the test ends; stop ends it early.
func serveAgent(t *testing.T, a *stubAgent) (addr string, stop func()) {
	t.Helper()
	a.sessions = map[string]bool{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(slog.New(slog.DiscardHandler))
	srv.ShutdownTimeout = time.Second
	srv.HandleService(agentv1connect.NewAgentServiceHandler(a, srv.HandlerOptions()...))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, ln) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return ln.Addr().String(), stop
}

// startControlPlane serves a control plane over agents and returns its URL.
func startControlPlane(t *testing.T, agents ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Serve(ctx, Config{Addr: ln.Addr().String(), Agents: agents, PollInterval: 20 * time.Millisecond}, ln, slog.New(slog.DiscardHandler))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

func execute(t *testing.T, c controlplanev1connect.ControlPlaneServiceClient, sid string, labels map[string]string) (string, error) {
	t.Helper()
	res, err := c.Execute(t.Context(), connect.NewRequest(&cpv1.ExecuteRequest{
		Execution: &executionv1.Execution{Language: "python", Code: "print(1)", SessionId: sid},
		Route:     &cpv1.Route{Labels: labels},
	}))
	if err != nil {
		return "", err
	}
	return res.Msg.GetResult().GetAgent(), nil
}

func TestRouting(t *testing.T) {
	t.Parallel()
	busy := &stubAgent{name: "busy", labels: map[string]string{"pool": "general"}}
	busy.free.Store(1)
	idle := &stubAgent{name: "idle", labels: map[string]string{"pool": "general"}}
	idle.free.Store(6)
	gpu := &stubAgent{name: "gpu", labels: map[string]string{"pool": "gpu"}}
	gpu.free.Store(2)
	var addrs []string
	for _, a := range []*stubAgent{busy, idle, gpu} {
		addr, _ := serveAgent(t, a)
		addrs = append(addrs, addr)
	}
	c := controlplanev1connect.NewControlPlaneServiceClient(server.NewClient(), startControlPlane(t, addrs...))

	t.Run("most free capacity wins", func(t *testing.T) {
		got, err := execute(t, c, "", map[string]string{"pool": "general"})
		if err != nil || got != "idle" {
			t.Fatalf("got %q, %v; want idle", got, err)
		}
	})
	t.Run("labels restrict", func(t *testing.T) {
		got, err := execute(t, c, "", map[string]string{"pool": "gpu"})
		if err != nil || got != "gpu" {
			t.Fatalf("got %q, %v; want gpu", got, err)
		}
	})
	t.Run("no agent with the labels", func(t *testing.T) {
		_, err := execute(t, c, "", map[string]string{"pool": "tpu"})
		if connect.CodeOf(err) != connect.CodeUnavailable {
			t.Fatalf("got %v, want unavailable", err)
		}
	})
	routeSessions(t, c, addrs)
	t.Run("languages are the union", func(t *testing.T) {
		res, err := c.ListLanguages(t.Context(), connect.NewRequest(&cpv1.ListLanguagesRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, l := range res.Msg.GetLanguages() {
			names = append(names, l.GetName())
		}
		if got := strings.Join(names, ","); got != "busy-lang,gpu-lang,idle-lang,python" {
			t.Fatalf("languages %s", got)
		}
	})
	t.Run("close session found on any agent", func(t *testing.T) {
		if _, err := execute(t, c, "sess-2", nil); err != nil {
			t.Fatal(err)
		}
		_, err := c.CloseSession(t.Context(), connect.NewRequest(&cpv1.CloseSessionRequest{SessionId: "sess-2"}))
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.CloseSession(t.Context(), connect.NewRequest(&cpv1.CloseSessionRequest{SessionId: "sess-2"}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("second close: %v, want not_found", err)
		}
	})
}

// routeSessions runs TestRouting's subtests on sessions: affinity, a session's route,
// and finding a session through a control plane that did not place it.
func routeSessions(t *testing.T, c controlplanev1connect.ControlPlaneServiceClient, addrs []string) {
	t.Run("session affinity", func(t *testing.T) {
		first, err := execute(t, c, "sess-1", nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			got, err := execute(t, c, "sess-1", nil)
			if err != nil || got != first {
				t.Fatalf("run %d went to %q (%v), want %q", i, got, err, first)
			}
		}
	})
	t.Run("a session keeps to its route", func(t *testing.T) {
		gpuOnly := map[string]string{"pool": "gpu"}
		if got, err := execute(t, c, "sess-3", gpuOnly); err != nil || got != "gpu" {
			t.Fatalf("first run went to %q (%v), want gpu", got, err)
		}
		for _, labels := range []map[string]string{gpuOnly, nil} {
			if got, err := execute(t, c, "sess-3", labels); err != nil || got != "gpu" {
				t.Fatalf("run with labels %v went to %q (%v), want gpu", labels, got, err)
			}
		}
		// Another route would run the session where the route does not
		// allow, or start it afresh elsewhere: refused.
		_, err := execute(t, c, "sess-3", map[string]string{"pool": "general"})
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Fatalf("run with another route: %v, want failed_precondition", err)
		}
	})
	t.Run("a session is found where it lives by a control plane that did not place it", func(t *testing.T) {
		// Placed on gpu by this control plane; another one (a restart)
		// would pick idle, the most free, for an unknown session.
		if got, err := execute(t, c, "sess-4", map[string]string{"pool": "gpu"}); err != nil || got != "gpu" {
			t.Fatalf("first run went to %q (%v), want gpu", got, err)
		}
		other := controlplanev1connect.NewControlPlaneServiceClient(server.NewClient(), startControlPlane(t, addrs...))
		var got string
		var err error
		testkit.Until(10*time.Second, func() bool { // until the new control plane has polled the agents
			got, err = execute(t, other, "sess-4", nil)
			return connect.CodeOf(err) != connect.CodeUnavailable
		})
		if err != nil || got != "gpu" {
			t.Fatalf("run through another control plane went to %q (%v), want gpu", got, err)
		}
	})
}

func TestLoadSpreadsAcrossEqualAgents(t *testing.T) {
	t.Parallel()
	a := &stubAgent{name: "a"}
	b := &stubAgent{name: "b"}
	a.free.Store(4)
	b.free.Store(4)
	addrA, _ := serveAgent(t, a)
	addrB, _ := serveAgent(t, b)
	c := controlplanev1connect.NewControlPlaneServiceClient(server.NewClient(), startControlPlane(t, addrA, addrB))
	for range 20 {
		if _, err := execute(t, c, "", nil); err != nil {
			t.Fatal(err)
		}
	}
	if a.ran.Load() < 5 || b.ran.Load() < 5 {
		t.Fatalf("runs a=%d b=%d: want both used", a.ran.Load(), b.ran.Load())
	}
}

func TestFailover(t *testing.T) {
	t.Parallel()
	refusing := &stubAgent{name: "refusing"}
	refusing.free.Store(8)
	refusing.refuse.Store(true)
	crashed := &stubAgent{name: "crashed"}
	crashed.free.Store(8)
	good := &stubAgent{name: "good"}
	good.free.Store(1)
	addrR, _ := serveAgent(t, refusing)
	addrC, stopC := serveAgent(t, crashed)
	addrG, _ := serveAgent(t, good)
	c := controlplanev1connect.NewControlPlaneServiceClient(server.NewClient(), startControlPlane(t, addrR, addrC, addrG))
	// Wait for the first poll to see all three, then crash one.
	waitHealthy(t, c, 3)
	stopC()
	for i := range 5 {
		got, err := execute(t, c, "", nil)
		if err != nil || got != "good" {
			t.Fatalf("run %d: %q, %v; want good", i, got, err)
		}
	}
	// A stream that has not started may go elsewhere too.
	st, err := c.ExecuteStream(t.Context(), connect.NewRequest(&cpv1.ExecuteStreamRequest{
		Execution: &executionv1.Execution{Language: "python", Code: "print(1)"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	var out string
	for st.Receive() {
		out += st.Msg().GetEvent().GetStdout()
	}
	if st.Err() != nil || out == "" {
		t.Fatalf("stream: %q %v", out, st.Err())
	}
}

// TestNoRunTwice: a run that failed after its agent started it is not made
// again on another agent, though the failure is unavailable, whether the
// agent answers so or the connection to it breaks mid-call.
func TestNoRunTwice(t *testing.T) {
	t.Parallel()
	dying := &stubAgent{name: "dying"}
	dying.free.Store(8)
	dying.dies.Store(true)
	good := &stubAgent{name: "good"}
	good.free.Store(1)
	addrD, _ := serveAgent(t, dying)
	addrG, _ := serveAgent(t, good)
	c := controlplanev1connect.NewControlPlaneServiceClient(server.NewClient(), startControlPlane(t, addrD, addrG))
	waitHealthy(t, c, 2)
	_, err := execute(t, c, "", nil)
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("run on a dying agent: %v, want unavailable", err)
	}
	st, err := c.ExecuteStream(t.Context(), connect.NewRequest(&cpv1.ExecuteStreamRequest{
		Execution: &executionv1.Execution{Language: "python", Code: "print(1)"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	for st.Receive() {
		t.Errorf("stream event from a dying agent: %v", st.Msg())
	}
	if connect.CodeOf(st.Err()) != connect.CodeUnavailable {
		t.Fatalf("stream on a dying agent: %v, want unavailable", st.Err())
	}
	if d, g := dying.ran.Load(), good.ran.Load(); d != 2 || g != 0 {
		t.Fatalf("runs: dying %d, good %d; want 2 and 0 (each run started once)", d, g)
	}
}

func waitHealthy(t *testing.T, c controlplanev1connect.ControlPlaneServiceClient, n int) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() error {
		res, err := c.ListAgents(t.Context(), connect.NewRequest(&cpv1.ListAgentsRequest{}))
		healthy := 0
		if err == nil {
			for _, a := range res.Msg.GetAgents() {
				if a.GetHealthy() {
					healthy++
				}
			}
		}
		if healthy != n {
			return fmt.Errorf("%d of %d agents healthy", healthy, n)
		}
		return nil
	})
}

func TestSeedEndpoints(t *testing.T) {
	t.Parallel()
	a := &stubAgent{name: "a"}
	a.free.Store(2)
	addr, _ := serveAgent(t, a)
	url := startControlPlane(t, addr)
	cases := []struct {
		name, method, path, body string
		wantCode                 int
		wantBody                 string
	}{
		{"run", "POST", "/run", `{"code":"print(1)","language":"python","sessionId":""}`, 200, `"output":"a"`},
		{"run upper-case language", "POST", "/run", `{"code":"print(1)","language":"Python"}`, 200, `"output":"a"`},
		{"unknown language", "POST", "/run", `{"code":"x","language":"cobol"}`, 400, "language"},
		{"empty code", "POST", "/run", `{"code":"","language":"python"}`, 400, "code"},
		{"bad json", "POST", "/run", `{"code":`, 400, "invalid JSON"},
		{"wrong method", "GET", "/run", "", 405, "POST"},
		{"status", "GET", "/status", "", 200, `"healthyAgents":1`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req, _ := http.NewRequestWithContext(t.Context(), tc.method, url+tc.path, strings.NewReader(tc.body))
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var b strings.Builder
			_, _ = fmt.Fprint(&b, readAll(res))
			if res.StatusCode != tc.wantCode || !strings.Contains(b.String(), tc.wantBody) {
				t.Fatalf("HTTP %d %s, want %d containing %s", res.StatusCode, b.String(), tc.wantCode, tc.wantBody)
			}
		})
	}
}

func readAll(res *http.Response) string {
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := res.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}

func TestParseAgents(t *testing.T) {
	t.Parallel()
	got := ParseAgents(" a:1;b:2;; c:3 ,d:4")
	if strings.Join(got, " ") != "a:1 b:2 c:3 d:4" {
		t.Fatalf("got %q", got)
	}
}

// startControlPlaneWith serves a control plane with cfg (its Addr set here)
// and returns its client.
func startControlPlaneWith(t *testing.T, cfg Config) controlplanev1connect.ControlPlaneServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = ln.Addr().String()
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 20 * time.Millisecond
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, cfg, ln, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return controlplanev1connect.NewControlPlaneServiceClient((&cluster.Links{Secret: cfg.Secret}).Client(nil), "http://"+ln.Addr().String())
}

// TestControlPlaneIgnoresAgentsForgedInRedis: a control plane reads from
// Redis only the agents sealed under its cluster secret: an agent written
// there by something without it (here: sealed under another secret) gets
// no run, while one sealed under the secret does.
func TestControlPlaneIgnoresAgentsForgedInRedis(t *testing.T) {
	t.Parallel()
	rds := redistest.Start(t)
	ctx := t.Context()
	secret, err := cluster.NewSecret(strings.Repeat("s", cluster.MinSecretLen))
	if err != nil {
		t.Fatal(err)
	}
	other, err := cluster.NewSecret(strings.Repeat("o", cluster.MinSecretLen))
	if err != nil {
		t.Fatal(err)
	}
	genuine := &stubAgent{name: "genuine"}
	genuine.free.Store(1)
	forged := &stubAgent{name: "forged"}
	forged.free.Store(8)
	genuineAddr, _ := serveAgent(t, genuine)
	forgedAddr, _ := serveAgent(t, forged)
	for _, rec := range []struct {
		secret *cluster.Secret
		addr   string
		free   int32
	}{{secret, genuineAddr, 1}, {other, forgedAddr, 8}} {
		s, err := redisstore.New(rds.URL, "test:", rec.secret.Key(redisstore.KeyPurpose), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = s.Heartbeat(ctx, router.AgentRecord{Address: rec.addr, Interval: time.Minute, Seen: time.Now(),
			Status: &agentv1.AgentStatus{Ready: true, Capacity: 8, Free: rec.free, Languages: []*executionv1.Language{{Name: "python"}}}})
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	cp := startControlPlaneWith(t, Config{RedisURL: rds.URL, RedisPrefix: "test:", Secret: secret})
	testkit.Eventually(t, 10*time.Second, func() error {
		if _, err := execute(t, cp, "", nil); err != nil {
			return fmt.Errorf("no run: %w", err)
		}
		return nil
	})
	for i := range 20 {
		if got, err := execute(t, cp, fmt.Sprintf("s%d", i%4), nil); err != nil || got != "genuine" {
			t.Fatalf("run %d went to %q (%v), want the genuine agent", i, got, err)
		}
	}
	if n := forged.ran.Load(); n != 0 {
		t.Errorf("the agent forged into Redis ran %d runs", n)
	}
}

// TestControlPlanesShareSessionsThroughRedis: two control planes on one
// real Redis route a session to the agent the first bound it to, and a
// session closed through one is closed through the other. When Redis dies,
// session runs are unavailable (never placed afresh) and stateless runs go on.
func TestControlPlanesShareSessionsThroughRedis(t *testing.T) {
	t.Parallel()
	rds := redistest.Start(t)
	var addrs []string
	for _, name := range []string{"a1", "a2"} {
		a := &stubAgent{name: name}
		a.free.Store(4)
		addr, _ := serveAgent(t, a)
		addrs = append(addrs, addr)
	}
	cpA := startControlPlaneWith(t, Config{Agents: addrs, RedisURL: rds.URL, RedisPrefix: "test:"})
	cpB := startControlPlaneWith(t, Config{Agents: addrs, RedisURL: rds.URL, RedisPrefix: "test:"})
	for i := range 6 {
		id := fmt.Sprintf("s%d", i)
		first, err := execute(t, []controlplanev1connect.ControlPlaneServiceClient{cpA, cpB}[i%2], id, nil)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			for _, cp := range []controlplanev1connect.ControlPlaneServiceClient{cpA, cpB} {
				if got, err := execute(t, cp, id, nil); err != nil || got != first {
					t.Fatalf("session %s ran on %s (%v), bound to %s", id, got, err, first)
				}
			}
		}
	}
	if _, err := cpA.CloseSession(t.Context(), connect.NewRequest(&cpv1.CloseSessionRequest{SessionId: "s0"})); err != nil {
		t.Fatal(err)
	}
	if _, err := execute(t, cpB, "s0", nil); connect.CodeOf(err) != connect.CodeNotFound || notFoundReason(err) != executionv1.SessionNotFound_REASON_CLOSED {
		t.Fatalf("a session closed through A, run through B: %v, want not_found, closed", err)
	}

	rds.Kill()
	_, err := execute(t, cpB, "s1", nil)
	if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "session store is unavailable") {
		t.Fatalf("a session run without Redis: %v, want unavailable naming the session store", err)
	}
	// It started nothing, and says so: the edge may take it to another
	// control plane.
	if !cluster.NotStarted(err) {
		t.Fatalf("a session run without Redis: %v, not marked as started nowhere", err)
	}
	if _, err := execute(t, cpA, "", nil); err != nil {
		t.Fatalf("a stateless run without Redis: %v", err)
	}
}
