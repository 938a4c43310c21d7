package agentd

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/testkit"
)

// TestStatefulSessions keeps Python state and the shell's working directory
// from one run to the next.
func TestStatefulSessions(t *testing.T) {
	t.Parallel()
	a := shared(t)
	tests := []struct {
		name, lang string
		steps      [][2]string // code, want stdout
	}{
		{"python variables", "python", [][2]string{{"x = 41", ""}, {"print(x + 1)", "42\n"}}},
		{"python imports and functions", "python", [][2]string{
			{"import math\ndef area(r):\n    return math.pi * r * r", ""},
			{"print(round(area(2), 3))", "12.566\n"},
		}},
		{"bash cd", "bash", [][2]string{{"mkdir -p /workspace/sub/dir && cd /workspace/sub", ""}, {"cd dir; pwd", "/workspace/sub/dir\n"}, {"pwd", "/workspace/sub/dir\n"}}},
		{"bash variables and functions", "bash", [][2]string{{"x=41; next() { echo $((x + 1)); }", ""}, {"next", "42\n"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := randomName("st")
			t.Cleanup(func() {
				a.client("connect").CloseSession(context.Background(), connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: id}))
			})
			for _, step := range tt.steps {
				res := a.exec(t, &executionv1.Execution{Language: tt.lang, Code: step[0], SessionId: id})
				if res.GetStdout() != step[1] || res.GetExitCode() != 0 {
					t.Fatalf("%q: %v, want stdout %q", step[0], res, step[1])
				}
			}
		})
	}
}

// TestSessionLifecycle creates, uses and closes a session through the API.
func TestSessionLifecycle(t *testing.T) {
	t.Parallel()
	a := shared(t)
	c := a.client("grpc")
	ctx := t.Context()
	id := randomName("life")
	res, err := c.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "python", SessionId: id}))
	if err != nil {
		t.Fatal(err)
	}
	s := res.Msg.GetSession()
	if s.GetId() != id || s.GetAgent() != a.cfg.Name || !s.GetExpireTime().AsTime().After(time.Now()) {
		t.Errorf("session %v", s)
	}
	if _, err := c.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "python", SessionId: id})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Errorf("second create: %v, want already_exists", err)
	}
	if r := a.exec(t, &executionv1.Execution{Language: "python", Code: "print('in session')", SessionId: id}); r.GetStdout() != "in session\n" {
		t.Errorf("run: %v", r)
	}
	// GetSession answers while a run of the session is going.
	running := make(chan error, 1)
	go func() {
		_, err := c.Execute(ctx, connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{Language: "python", Code: "import time; time.sleep(3)", SessionId: id}}))
		running <- err
	}()
	testkit.WaitFor(t, 10*time.Second, "the session's run to start", func() bool { return a.sessions.Running() > 0 })
	start := time.Now()
	got, err := c.GetSession(ctx, connect.NewRequest(&agentv1.GetSessionRequest{SessionId: id}))
	if err != nil || got.Msg.GetSession().GetId() != id || got.Msg.GetSession().GetLanguage() != "python" {
		t.Errorf("GetSession = %v, %v", got, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("GetSession waited %v for the run", d)
	}
	if err := <-running; err != nil {
		t.Errorf("run: %v", err)
	}
	if _, err := c.GetSession(ctx, connect.NewRequest(&agentv1.GetSessionRequest{SessionId: "no-" + id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("GetSession of an unknown session: %v, want not_found", err)
	}
	st, err := c.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
	if err != nil || st.Msg.GetStatus().GetSessions() < 1 {
		t.Errorf("status %v, %v: want a session", st, err)
	}
	if _, err := c.CloseSession(ctx, connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CloseSession(ctx, connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("second close: %v, want not_found", err)
	}
	if _, err := c.GetSession(ctx, connect.NewRequest(&agentv1.GetSessionRequest{SessionId: id})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("GetSession after close: %v, want not_found", err)
	}
	// A closed session is never opened again as a new one, even where a
	// new id would be: the run is not_found, saying it was closed.
	_, err = c.Execute(ctx, connect.NewRequest(&agentv1.ExecuteRequest{AllowNewSession: true,
		Execution: &executionv1.Execution{Language: "python", Code: "print('x' in globals())", SessionId: id}}))
	if connect.CodeOf(err) != connect.CodeNotFound || testkit.ErrorDetail[*executionv1.SessionNotFound](err).GetReason() != executionv1.SessionNotFound_REASON_CLOSED {
		t.Errorf("run after close: %v (reason %v), want not_found, closed", err, testkit.ErrorDetail[*executionv1.SessionNotFound](err).GetReason())
	}
}

// TestSessionBelongsToItsTenant checks that the agent itself keeps tenants
// apart: whatever session id another tenant sends, it finds no session.
func TestSessionBelongsToItsTenant(t *testing.T) {
	t.Parallel()
	a := shared(t)
	c := a.client("connect")
	ctx := t.Context()
	id := "owned-" + strings.ReplaceAll(t.Name(), "/", "-")
	if _, err := c.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "python", SessionId: id, Tenant: "team-a"})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.CloseSession(context.Background(), connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: id, Tenant: "team-a"}))
	})
	run := func(tenant, code string, allowNew bool) (*executionv1.Result, error) {
		res, err := c.Execute(ctx, connect.NewRequest(&agentv1.ExecuteRequest{Tenant: tenant, AllowNewSession: allowNew,
			Execution: &executionv1.Execution{Language: "python", Code: code, SessionId: id}}))
		if err != nil {
			return nil, err
		}
		return res.Msg.GetResult(), nil
	}
	if _, err := run("team-a", "secret = 'a'\nopen('/workspace/mine.txt', 'w').write('a')", false); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{"team-b", ""} {
		if _, err := run(tenant, "print(secret)", true); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("%q: Execute in another tenant's session: %v, want not_found", tenant, err)
		}
		if _, err := c.GetSession(ctx, connect.NewRequest(&agentv1.GetSessionRequest{SessionId: id, Tenant: tenant})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("%q: GetSession: %v, want not_found", tenant, err)
		}
		if _, err := c.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{SessionId: id, Tenant: tenant, Path: "mine.txt"})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("%q: ReadFile: %v, want not_found", tenant, err)
		}
		if _, err := c.ListFiles(ctx, connect.NewRequest(&agentv1.ListFilesRequest{SessionId: id, Tenant: tenant})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("%q: ListFiles: %v, want not_found", tenant, err)
		}
		if _, err := c.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{SessionId: id, Tenant: tenant, File: &executionv1.File{Path: "mine.txt", Content: []byte("b")}})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("%q: WriteFile: %v, want not_found", tenant, err)
		}
		if _, err := c.CloseSession(ctx, connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: id, Tenant: tenant})); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("%q: CloseSession: %v, want not_found", tenant, err)
		}
	}
	// The owner's session is untouched.
	res, err := run("team-a", "print(secret, open('/workspace/mine.txt').read())", false)
	if err != nil || res.GetStdout() != "a a\n" {
		t.Errorf("owner's run after the other tenant's attempts: %v %v", res, err)
	}
}

// TestSessionLimits closes idle sessions and bounds their number.
func TestSessionLimits(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) {
		c.MinActive = 1
		c.MaxSandboxes = 3
		c.MaxSessions = 1
		c.SessionIdleTTL = 2 * time.Second
	})
	c := a.client("connect")
	ctx := t.Context()
	if _, err := c.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "bash", SessionId: "one"})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "bash", SessionId: "two"})); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("second session: %v, want resource_exhausted", err)
	}
	testkit.WaitFor(t, 10*time.Second, "the idle session to close", func() bool { return a.sessions.Len() == 0 })
	// A session may ask for its own idle timeout.
	if _, err := c.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "bash", SessionId: "two", IdleTimeout: durationpb.New(time.Hour)})); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second) // longer than the agent's idle TTL
	if a.sessions.Len() != 1 {
		t.Error("session with a one-hour idle timeout was closed")
	}
}

// TestSessionFiles writes, lists and reads a session's files through the
// API, and refuses paths that leave the workspace.
func TestSessionFiles(t *testing.T) {
	t.Parallel()
	a := shared(t)
	c := a.client("connect")
	ctx := t.Context()
	id := randomName("files")
	if _, err := c.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{SessionId: id, Path: "x"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("read in an unknown session: %v, want not_found", err)
	}
	if _, err := c.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "python", SessionId: id})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.CloseSession(context.Background(), connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: id}))
	})
	if _, err := c.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{SessionId: id, File: &executionv1.File{Path: "data/in.txt", Content: []byte("hello")}})); err != nil {
		t.Fatal(err)
	}
	if r := a.exec(t, &executionv1.Execution{Language: "python", SessionId: id, Code: "open('data/out.txt', 'w').write(open('data/in.txt').read().upper())"}); r.GetExitCode() != 0 {
		t.Fatalf("run: %v", r)
	}
	list, err := c.ListFiles(ctx, connect.NewRequest(&agentv1.ListFilesRequest{SessionId: id, Path: "data"}))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range list.Msg.GetFiles() {
		names = append(names, f.GetPath())
	}
	if strings.Join(names, ",") != "data/in.txt,data/out.txt" {
		t.Errorf("listed %q", names)
	}
	got, err := c.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{SessionId: id, Path: "data/out.txt"}))
	if err != nil || string(got.Msg.GetFile().GetContent()) != "HELLO" {
		t.Errorf("read: %v, %v", got, err)
	}
	if _, err := c.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{SessionId: id, Path: "missing"})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("read a missing file: %v, want not_found", err)
	}
	for _, bad := range []string{"../etc/passwd", "/etc/passwd", "a/../../b"} {
		if _, err := c.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{SessionId: id, Path: bad})); connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("read %q: %v, want invalid_argument", bad, err)
		}
	}
	// A symbolic link out of the workspace is refused by the runner.
	a.exec(t, &executionv1.Execution{Language: "bash", SessionId: id, Code: "ln -s /etc/passwd link"})
	if _, err := c.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{SessionId: id, Path: "link"})); err == nil {
		t.Error("read through a symbolic link out of the workspace succeeded")
	}
}

// TestSessionFilesStayInWorkspace plants links out of the workspace in a
// session (to /etc, to the runner's /proc directory, to /tmp, at several
// depths) and checks that the file API follows none of them: reads and
// lists are refused with failed_precondition, and writes create nothing
// outside.
func TestSessionFilesStayInWorkspace(t *testing.T) {
	t.Parallel()
	a := shared(t)
	c := a.client("connect")
	ctx := t.Context()
	id := randomName("links")
	if _, err := c.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "bash", SessionId: id})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.CloseSession(context.Background(), connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: id}))
	})
	if r := a.exec(t, &executionv1.Execution{Language: "bash", SessionId: id,
		Code: "ln -s /etc d && mkdir -p a x/y && ln -s /proc/1 a/b && ln -s / x/y/z && ln -s ../.. up && ln -s /tmp t"}); r.GetExitCode() != 0 {
		t.Fatalf("plant links: %v", r)
	}
	for _, p := range []string{"d/shadow", "d/hostname", "a/b/environ", "x/y/z/etc/shadow", "up/etc/shadow"} {
		got, err := c.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{SessionId: id, Path: p}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("ReadFile(%q) = %.40q, %v; want failed_precondition", p, got.Msg.GetFile().GetContent(), err)
		}
	}
	for _, p := range []string{"d", "a/b", "x/y/z", "up", "t"} {
		got, err := c.ListFiles(ctx, connect.NewRequest(&agentv1.ListFilesRequest{SessionId: id, Path: p}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("ListFiles(%q) = %d entries, %v; want failed_precondition", p, len(got.Msg.GetFiles()), err)
		}
	}
	for _, p := range []string{"t/x", "x/y/z/tmp/x", "up/tmp/x", "d/x"} {
		_, err := c.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{SessionId: id, File: &executionv1.File{Path: p, Content: []byte("x")}}))
		if connect.CodeOf(err) != connect.CodeFailedPrecondition {
			t.Errorf("WriteFile(%q): %v, want failed_precondition", p, err)
		}
	}
	if r := a.exec(t, &executionv1.Execution{Language: "bash", SessionId: id, Code: "ls -A /tmp; ls /etc/x 2>/dev/null; echo end"}); r.GetStdout() != "end\n" {
		t.Errorf("outside the workspace after the writes: %q", r.GetStdout())
	}
}

// TestSessionSurvivesItsProgram shows a session keeping its files when a
// run is killed at its timeout or for memory; the interpreter restarts.
func TestSessionSurvivesItsProgram(t *testing.T) {
	t.Parallel()
	a := shared(t)
	id := randomName("survive")
	t.Cleanup(func() {
		a.client("connect").CloseSession(context.Background(), connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: id}))
	})
	// The memory bomb gets a long timeout: on a loaded machine, filling
	// the sandbox's memory can take longer than the 3 s the busy loop gets.
	steps := []struct {
		code    string
		timeout time.Duration
		check   func(*executionv1.Result) bool
	}{
		{"open('keep.txt', 'w').write('kept'); x = 1", 3 * time.Second, func(r *executionv1.Result) bool { return r.GetExitCode() == 0 }},
		{"while True: pass", 3 * time.Second, func(r *executionv1.Result) bool { return r.GetTimedOut() }},
		{"b = []\nwhile True:\n    b.append(bytearray(8 << 20))", 60 * time.Second, func(r *executionv1.Result) bool { return r.GetOomKilled() }},
		{"print(open('keep.txt').read(), 'x' in globals())", 3 * time.Second, func(r *executionv1.Result) bool { return r.GetStdout() == "kept False\n" }},
	}
	for _, st := range steps {
		r := a.exec(t, &executionv1.Execution{Language: "python", SessionId: id, Code: st.code, Timeout: durationpb.New(st.timeout)})
		if !st.check(r) {
			t.Fatalf("%q: %v", st.code, r)
		}
	}
}

// TestSessionsPerTenant: a tenant at --max-sessions-per-tenant is refused a
// new session (resource_exhausted, naming the limit) while another tenant
// opens one; an idle timeout above --max-session-idle-ttl is refused; the
// status counts each tenant's sessions.
func TestSessionsPerTenant(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) {
		c.MinActive = 1
		c.MaxSandboxes = 3
		c.MaxSessions = 2
		c.MaxSessionsPerTenant = 1
		c.MaxSessionIdleTTL = time.Hour
	})
	c := a.client("connect")
	ctx := t.Context()
	if _, err := c.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "bash", SessionId: "a-1", Tenant: "team-a"})); err != nil {
		t.Fatal(err)
	}
	_, err := c.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "bash", SessionId: "a-2", Tenant: "team-a"}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "tenant has 1 open session on this agent") || !strings.Contains(err.Error(), "--max-sessions-per-tenant") {
		t.Errorf("second session of team-a: %v, want resource_exhausted naming the limit per tenant", err)
	}
	_, err = c.Execute(ctx, connect.NewRequest(&agentv1.ExecuteRequest{Tenant: "team-a", AllowNewSession: true,
		Execution: &executionv1.Execution{Language: "bash", Code: "true", SessionId: "a-3"}}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "--max-sessions-per-tenant") {
		t.Errorf("run opening a second session of team-a: %v, want resource_exhausted naming the limit per tenant", err)
	}
	_, err = c.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "bash", SessionId: "b-1", Tenant: "team-b", IdleTimeout: durationpb.New(2 * time.Hour)}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "--max-session-idle-ttl") {
		t.Errorf("idle timeout above the limit: %v, want invalid_argument naming --max-session-idle-ttl", err)
	}
	if _, err := c.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{Language: "bash", SessionId: "b-1", Tenant: "team-b", IdleTimeout: durationpb.New(time.Hour)})); err != nil {
		t.Fatalf("team-b's session while team-a is at its limit: %v", err)
	}
	st, err := c.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Msg.GetStatus().GetTenantSessions(); len(got) != 2 || got["team-a"] != 1 || got["team-b"] != 1 {
		t.Errorf("status tenant_sessions %v, want team-a and team-b with one each", got)
	}
}
