package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// TestInternalServicesRefuseOpenAddresses starts an agent and a control
// plane on an address off loopback with no cluster secret: each must exit
// non-zero, saying how to configure one, before it binds anything.
func TestInternalServicesRefuseOpenAddresses(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"agent", []string{"--addr", "0.0.0.0:0", "--name", "e2e-open", "--runner", filepath.Join(binDir, "runner")}, "CODEMODE_CLUSTER_SECRET_FILE"},
		{"controlplane", []string{"--addr", "0.0.0.0:0"}, "CODEMODE_CLUSTER_SECRET_FILE"},
		{"edge", []string{"--addr", "0.0.0.0:0"}, "--api-keys"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(binDir, tt.name), tt.args...)
			cmd.Env = withoutSecret(os.Environ())
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("%s on 0.0.0.0 with no secret: %v, want a non-zero exit\n%s", tt.name, err, out)
			}
			if !strings.Contains(string(out), "refusing to serve on 0.0.0.0:0") || !strings.Contains(string(out), tt.want) {
				t.Errorf("%s's message does not say what to do:\n%s", tt.name, out)
			}
		})
	}
}

func withoutSecret(env []string) []string {
	var out []string
	for _, e := range env {
		if !strings.HasPrefix(e, "CODEMODE_CLUSTER_SECRET") && !strings.HasPrefix(e, "CODEMODE_API_KEYS") {
			out = append(out, e)
		}
	}
	return out
}

// TestInternalServicesRequireTheSecret calls the control plane and the
// agent of a stack without the cluster secret and with a wrong one: every
// protocol gets unauthenticated, and so does the control plane's /run.
func TestInternalServicesRequireTheSecret(t *testing.T) {
	t.Parallel()
	s := shared(t)
	for _, secret := range []string{"", "wrong-" + newSecret()} {
		name := "none"
		if secret != "" {
			name = "wrong"
		}
		c := server.NewClient()
		if secret != "" {
			c.Transport = bearerTransport{secret: secret, base: c.Transport}
		}
		for _, p := range protocols {
			t.Run(name+"/"+p.name, func(t *testing.T) {
				t.Parallel()
				cp := controlplanev1connect.NewControlPlaneServiceClient(c, s.ControlPlane.URL(), p.opts...)
				_, err := cp.Execute(t.Context(), connect.NewRequest(&cpv1.ExecuteRequest{Execution: &executionv1.Execution{Language: "python", Code: "print(1)"}}))
				if connect.CodeOf(err) != connect.CodeUnauthenticated {
					t.Errorf("control plane Execute: %v, want unauthenticated", err)
				}
				if _, err := cp.ListAgents(t.Context(), connect.NewRequest(&cpv1.ListAgentsRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
					t.Errorf("control plane ListAgents: %v, want unauthenticated", err)
				}
				// A stranger cannot join routing as an agent.
				hb := &cpv1.HeartbeatRequest{Address: "127.0.0.1:1", Status: &agentv1.AgentStatus{Name: "stranger", Ready: true, Capacity: 4, Free: 4},
					Interval: durationpb.New(time.Second)}
				if _, err := cp.Heartbeat(t.Context(), connect.NewRequest(hb)); connect.CodeOf(err) != connect.CodeUnauthenticated {
					t.Errorf("control plane Heartbeat: %v, want unauthenticated", err)
				}
				ag := agentv1connect.NewAgentServiceClient(c, "http://"+s.Agent.Addr, p.opts...)
				_, err = ag.Execute(t.Context(), connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{Language: "python", Code: "print(1)"}}))
				if connect.CodeOf(err) != connect.CodeUnauthenticated {
					t.Errorf("agent Execute: %v, want unauthenticated", err)
				}
				if _, err := ag.ReadFile(t.Context(), connect.NewRequest(&agentv1.ReadFileRequest{SessionId: "s", Path: "x"})); connect.CodeOf(err) != connect.CodeUnauthenticated {
					t.Errorf("agent ReadFile: %v, want unauthenticated", err)
				}
			})
		}
		t.Run(name+"/seed", func(t *testing.T) {
			t.Parallel()
			for _, path := range []string{"/run", "/status"} {
				method, body := http.MethodPost, `{"code":"print(1)","language":"python"}`
				if path == "/status" {
					method, body = http.MethodGet, ""
				}
				req, _ := http.NewRequestWithContext(t.Context(), method, s.ControlPlane.URL()+path, strings.NewReader(body))
				if secret != "" {
					req.Header.Set("Authorization", "Bearer "+secret)
				}
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				if res.StatusCode != http.StatusUnauthorized {
					t.Errorf("control plane %s: HTTP %d, want 401", path, res.StatusCode)
				}
			}
		})
	}
	// The secret opens the door; health checks need none.
	if _, err := s.ControlPlaneClient().ListAgents(t.Context(), connect.NewRequest(&cpv1.ListAgentsRequest{})); err != nil {
		t.Errorf("with the secret: %v", err)
	}
}

// TestLargeBodyWithoutSecretIsNotRead sends 100 MB to the control plane
// and the agent without the secret: they refuse it from the header, and
// their memory does not grow by the body.
func TestLargeBodyWithoutSecretIsNotRead(t *testing.T) {
	t.Parallel()
	s := shared(t)
	for _, p := range []*Process{s.ControlPlane, s.Agent} {
		before := rssKiB(t, p)
		for _, path := range []string{"/codemode.controlplane.v1.ControlPlaneService/Execute", "/codemode.agent.v1.AgentService/Execute", "/run"} {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, p.URL()+path, io.LimitReader(zeros{}, 100<<20))
			req.ContentLength = 100 << 20
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				// The server may close the connection while the body is
				// still being sent: that is a refusal too.
				continue
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s %s: HTTP %d, want 401", p.Name, path, res.StatusCode)
			}
		}
		if grown := rssKiB(t, p) - before; grown > 10<<10 {
			t.Errorf("%s's RSS grew by %d KiB over three refused 100 MB bodies, want < 10 MiB", p.Name, grown)
		}
	}
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// rssKiB is the resident memory of p, in KiB.
func rssKiB(t *testing.T, p *Process) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.Fields(v)[0])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", p.Pid())
	return 0
}

// keyedEdge starts an edge with API keys for tenants team-a and team-b in
// front of the shared stack, and returns it with the two keys.
func keyedEdge(t *testing.T, s *Stack) (edge *Process, keyA, keyB string) {
	t.Helper()
	keyA, keyB = "ka-"+newSecret()[:24], "kb-"+newSecret()[:24]
	file := filepath.Join(t.TempDir(), "keys.json")
	b, _ := json.Marshal(map[string]string{keyA: "team-a", keyB: "team-b"})
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	edge, err := s.StartEdge(nil, "--api-keys", file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { edge.Stop(30 * time.Second) })
	return edge, keyA, keyB
}

func bearerClient(key string) *http.Client {
	c := server.NewClient()
	c.Transport = bearerTransport{secret: key, base: c.Transport}
	return c
}

// TestTenantsCannotReachEachOthersSessions has tenant B try, through every
// door, to run in, read, write, list and close tenant A's session, by the
// id A uses: B finds nothing, and A's session is untouched.
//
// It runs with API keys, with tokens, and with one of each: tenants are
// kept apart alike whatever their credentials.
func TestTenantsCannotReachEachOthersSessions(t *testing.T) {
	t.Parallel()
	for _, kind := range credentialKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			tenantsCannotReachEachOthersSessions(t, kind)
		})
	}
}

func tenantsCannotReachEachOthersSessions(t *testing.T, kind credentialKind) {
	s := shared(t)
	edge, keyA, keyB := kind.edge(t, s)
	a := edgev1connect.NewExecutionServiceClient(bearerClient(keyA), edge.URL())
	sess, err := a.CreateSession(t.Context(), connect.NewRequest(&edgev1.CreateSessionRequest{Language: "python"}))
	if err != nil {
		t.Fatal(err)
	}
	id := sess.Msg.GetSession().GetId()
	t.Cleanup(func() {
		a.CloseSession(context.Background(), connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: id}))
	})
	if _, err := a.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", SessionId: id,
		Code: "secret = 'of-a'\nopen('/workspace/a.txt', 'w').write('of-a')"})); err != nil {
		t.Fatal(err)
	}

	// B has no session of that id: reading, listing and closing it find
	// nothing, on every protocol.
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			b := edgev1connect.NewExecutionServiceClient(bearerClient(keyB), edge.URL(), p.opts...)
			ctx := t.Context()
			if _, err := b.ReadFile(ctx, connect.NewRequest(&edgev1.ReadFileRequest{SessionId: id, Path: "a.txt"})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Errorf("ReadFile: %v, want not_found", err)
			}
			if _, err := b.ListFiles(ctx, connect.NewRequest(&edgev1.ListFilesRequest{SessionId: id})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Errorf("ListFiles: %v, want not_found", err)
			}
			if _, err := b.CloseSession(ctx, connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: id})); connect.CodeOf(err) != connect.CodeNotFound {
				t.Errorf("CloseSession: %v, want not_found", err)
			}
		})
	}
	// A run or a write by B under that id opens B's own session, which
	// shows nothing of A's.
	for _, p := range protocols {
		t.Run(p.name+"/run", func(t *testing.T) {
			b := edgev1connect.NewExecutionServiceClient(bearerClient(keyB), edge.URL(), p.opts...)
			res, err := b.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", SessionId: id,
				Code: "import os\nprint(globals().get('secret'), os.path.exists('/workspace/a.txt'))"}))
			if err != nil || res.Msg.GetResult().GetStdout() != "None False\n" {
				t.Errorf("B's run under A's id: %v %v, want a fresh session of B's", res, err)
			}
			if _, err := b.WriteFile(t.Context(), connect.NewRequest(&edgev1.WriteFileRequest{SessionId: id, File: &executionv1.File{Path: "b.txt", Content: []byte("of-b")}})); err != nil {
				t.Errorf("WriteFile into B's own session: %v", err)
			}
		})
	}
	t.Run("mcp", func(t *testing.T) { mcpShowsNothingOfA(t, edge.URL(), keyB, id) })
	t.Run("run", func(t *testing.T) {
		var out struct{ Output, Error string }
		code := postJSONWith(t, edge.URL()+"/run", keyB, `{"code":"print(globals().get('secret'))","language":"python","sessionId":"`+id+`"}`, &out)
		if strings.Contains(out.Output, "of-a") {
			t.Errorf("/run: HTTP %d, tenant B read A's session: %+v", code, out)
		}
	})
	// A's session is untouched.
	res, err := a.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", SessionId: id,
		Code: "import os\nprint(secret, open('/workspace/a.txt').read(), sorted(os.listdir('/workspace')))"}))
	if err != nil || res.Msg.GetResult().GetStdout() != "of-a of-a ['a.txt', 'outputs']\n" {
		t.Errorf("A's session after B's attempts: %v %v", res, err)
	}
}

// mcpShowsNothingOfA has tenant B, with keyB, run in, read and list A's
// session id through the MCP door of the edge at base: nothing of A's
// shows.
func mcpShowsNothingOfA(t *testing.T, base, keyB, id string) {
	cs := keyedMCP(t, base+"/mcp", keyB)
	for _, call := range []struct {
		name string
		args map[string]any
	}{
		{"execute_code", map[string]any{"code": "print(globals().get('secret'))", "session_id": id}},
		{"read_file", map[string]any{"session_id": id, "path": "a.txt"}},
		{"list_files", map[string]any{"session_id": id}},
	} {
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: call.name, Arguments: call.args})
		if err != nil {
			t.Fatalf("%s: %v", call.name, err)
		}
		if strings.Contains(testkit.ToolText(res), "of-a") {
			t.Errorf("%s: tenant B read A's data: %s", call.name, testkit.ToolText(res))
		}
	}
}

func keyedMCP(t *testing.T, endpoint, key string) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	cs, err := client.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: bearerClient(key)}, nil)
	if err != nil {
		t.Fatalf("connect MCP %s: %v", endpoint, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestTenantsCannotUseEachOthersMCPSessions has tenant A open an MCP
// session on each MCP endpoint, and tenant B, with its own key, send
// requests of every method naming A's session: tool calls, tools/list,
// ping, the stream (GET) and the end of the session (DELETE). Each gets
// exactly what a session id nobody has gets, HTTP 404, and shows none of
// A's files; A's sessions keep working, and the edge's log never holds
// their ids, only their hashes.
//
// It runs with API keys, with tokens, and with one of each.
func TestTenantsCannotUseEachOthersMCPSessions(t *testing.T) {
	t.Parallel()
	for _, kind := range credentialKinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			tenantsCannotUseEachOthersMCPSessions(t, kind)
		})
	}
}

func tenantsCannotUseEachOthersMCPSessions(t *testing.T, kind credentialKind) {
	s := shared(t)
	edge, keyA, keyB := kind.edge(t, s)
	withCode := keyedMCP(t, edge.URL()+"/mcp", keyA)
	withoutCode := keyedMCP(t, edge.URL()+"/mcp-no-code-execute", keyA)
	alias := keyedMCP(t, edge.URL()+"/no-code/mcp", keyA)
	sess := "mcp-trust-" + newSecret()[:12] // A's code-execution session
	if r := call(t, withCode, "execute_code", map[string]any{"session_id": sess, "language": "python",
		"code": "secret = 'of-a'\nopen('/workspace/a.txt', 'w').write('of-a')"}); r.IsError {
		t.Fatalf("A's run: %s", testkit.ToolText(r))
	}
	t.Cleanup(func() {
		withCode.CallTool(context.Background(), &mcp.CallToolParams{Name: "close_session", Arguments: map[string]any{"session_id": sess}})
	})

	toolCall := func(id int, tool, args string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, id, tool, args)
	}
	list := `{"jsonrpc":"2.0","id":20,"method":"tools/list"}`
	ping := `{"jsonrpc":"2.0","id":21,"method":"ping"}`
	for _, door := range []struct {
		path  string
		cs    *mcp.ClientSession
		posts []string
	}{
		{"/mcp", withCode, []string{
			toolCall(1, "execute_code", `{"session_id":"`+sess+`","language":"python","code":"import os\nprint(globals().get('secret'), os.listdir('/workspace'))"}`),
			toolCall(2, "execute_code", `{"language":"python","code":"print('ran-by-b')"}`),
			toolCall(3, "list_files", `{"session_id":"`+sess+`"}`),
			toolCall(4, "read_file", `{"session_id":"`+sess+`","path":"a.txt"}`),
			toolCall(5, "close_session", `{"session_id":"`+sess+`"}`),
			list, ping,
		}},
		{"/mcp-no-code-execute", withoutCode, []string{toolCall(6, "list_languages", `{}`), list, ping}},
		{"/no-code/mcp", alias, []string{toolCall(7, "list_languages", `{}`), list, ping}},
	} {
		t.Run(strings.TrimPrefix(door.path, "/"), func(t *testing.T) {
			bGetsWhatUnknownSessionsGet(t, edge.URL()+door.path, keyB, door.cs, door.posts)
		})
	}
	if r := call(t, withCode, "execute_code", map[string]any{"session_id": sess, "language": "python",
		"code": "import os\nprint(secret, open('/workspace/a.txt').read(), sorted(os.listdir('/workspace')))"}); r.IsError ||
		structured(t, r)["stdout"] != "of-a of-a ['a.txt', 'outputs']\n" {
		t.Errorf("A's session after B's requests: %s", testkit.ToolText(r))
	}
	if r := call(t, withoutCode, "list_languages", nil); r.IsError {
		t.Errorf("A's list_languages after B's requests: %s", testkit.ToolText(r))
	}

	logs := edge.Logs()
	for _, cs := range []*mcp.ClientSession{withCode, withoutCode} {
		if strings.Contains(logs, cs.ID()) {
			t.Errorf("the edge logged the MCP session id %s", cs.ID())
		}
		sum := sha256.Sum256([]byte(cs.ID()))
		if h := hex.EncodeToString(sum[:6]); !strings.Contains(logs, h) {
			t.Errorf("the edge's log does not name the MCP session by its hash %s", h)
		}
	}
}

// bGetsWhatUnknownSessionsGet has tenant B, with keyB, POST each of posts,
// GET the stream and DELETE the session, at the MCP endpoint url, naming
// A's session cs: each answer is what a session id nobody has gets, and
// shows none of A's data; A's session is untouched.
func bGetsWhatUnknownSessionsGet(t *testing.T, url, keyB string, cs *mcp.ClientSession, posts []string) {
	type request struct{ method, body string }
	var requests []request
	for _, b := range posts {
		requests = append(requests, request{http.MethodPost, b})
	}
	requests = append(requests, request{http.MethodGet, ""}, request{http.MethodDelete, ""})
	for _, r := range requests {
		unknown := mcpRequest(t, url, r.method, r.body, keyB, strings.ToUpper(newSecret()[:26]))
		if unknown.status != http.StatusNotFound {
			t.Fatalf("%s %s on an unknown session: %s, want 404", r.method, r.body, unknown)
		}
		got := mcpRequest(t, url, r.method, r.body, keyB, cs.ID())
		if got != unknown {
			t.Errorf("%s %s by B on A's session: %s, want what an unknown session gets: %s", r.method, r.body, got, unknown)
		}
		if strings.Contains(got.body, "of-a") || strings.Contains(got.body, "a.txt") || strings.Contains(got.body, "ran-by-b") {
			t.Errorf("%s %s by B on A's session showed A's data or ran: %s", r.method, r.body, got)
		}
	}
	// A's session is untouched.
	if _, err := cs.ListTools(t.Context(), nil); err != nil {
		t.Errorf("A's tools/list after B's requests: %v", err)
	}
	if err := cs.Ping(t.Context(), nil); err != nil {
		t.Errorf("A's ping after B's requests: %v", err)
	}
}

// httpAnswer is an HTTP answer as a caller sees it.
type httpAnswer struct {
	status      int
	contentType string
	body        string
}

func (a httpAnswer) String() string {
	body := a.body
	if len(body) > 300 {
		body = body[:300] + "..."
	}
	return fmt.Sprintf("HTTP %d %s %q", a.status, a.contentType, body)
}

// mcpRequest sends one raw MCP request with key in the MCP session named
// session: a POST of body, or a GET (the stream, of which only the status
// is read when it opens) or a DELETE (the end of the session).
func mcpRequest(t *testing.T, url, method, body, key, session string) httpAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var rd io.Reader
	if method == http.MethodPost {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Mcp-Session-Id", session)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	switch method {
	case http.MethodPost:
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
	case http.MethodGet:
		req.Header.Set("Accept", "text/event-stream")
	}
	res, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	a := httpAnswer{status: res.StatusCode, contentType: res.Header.Get("Content-Type")}
	if method != http.MethodGet || res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		a.body = string(b)
	}
	return a
}

// postJSONWith posts body with an API key and decodes the JSON answer.
func postJSONWith(t *testing.T, url, key, body string, out any) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("decode %s answer %q: %v", url, b, err)
		}
	}
	return res.StatusCode
}

// TestEndedSessionsAreNotFound checks that a closed session, and one whose
// agent restarted, answer not_found with the reason on Connect, /run and
// MCP, quoting the caller's id, and are never reborn empty.
func TestEndedSessionsAreNotFound(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	s, err := StartStack("e2e-ended", "--min-active", "1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	ctx := t.Context()
	open := func(id string) {
		t.Helper()
		if _, err := c.Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", SessionId: id, Code: "x = 1"})); err != nil {
			t.Fatalf("open %s: %v\n%s", id, err, s.Logs())
		}
	}
	// check expects every door to say that session id is gone for want.
	check := func(id, want string) {
		t.Helper()
		_, err := c.Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", SessionId: id, Code: "print(x)"}))
		if connect.CodeOf(err) != connect.CodeNotFound || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), quote(id)) {
			t.Errorf("Connect run in %s: %v, want not_found saying %q and quoting the id", id, err, want)
		}
		if _, err := c.ListFiles(ctx, connect.NewRequest(&edgev1.ListFilesRequest{SessionId: id})); connect.CodeOf(err) != connect.CodeNotFound || !strings.Contains(err.Error(), want) {
			t.Errorf("Connect ListFiles in %s: %v, want not_found saying %q", id, err, want)
		}
		var out struct {
			Output, Error string
			ExitCode      int
		}
		code := postJSONWith(t, s.Edge.URL()+"/run", "", `{"code":"print(x)","language":"python","sessionId":"`+id+`"}`, &out)
		if code != http.StatusNotFound || !strings.Contains(out.Error, want) {
			t.Errorf("/run in %s: HTTP %d %+v, want 404 saying %q", id, code, out, want)
		}
		res := callTool(t, s.Edge.URL()+"/mcp", "execute_code", map[string]any{"code": "print(x)", "session_id": id})
		if !res.IsError || !strings.Contains(testkit.ToolText(res), want) {
			t.Errorf("MCP run in %s: %s (isError %v), want an error saying %q", id, testkit.ToolText(res), res.IsError, want)
		}
	}

	open("closed-one")
	if _, err := c.CloseSession(ctx, connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: "closed-one"})); err != nil {
		t.Fatal(err)
	}
	check("closed-one", "was closed")

	// The control plane remembers that the agent confirmed the session.
	open("kept-one")
	if err := s.RestartAgent(); err != nil {
		t.Fatal(err)
	}
	check("kept-one", "was lost")

	// With the control plane restarted too, the agent's journal remembers.
	open("kept-two")
	if err := s.RestartAgent(); err != nil {
		t.Fatal(err)
	}
	if err := s.RestartControlPlane(); err != nil {
		t.Fatal(err)
	}
	check("kept-two", "was lost")
	check("closed-one", "was closed")
	// A new id still opens a session on first use.
	open("new-one")
}

// RestartAgent stops the stack's agent and starts it again on the same
// address, with the same flags and state, then waits until the control
// plane sees it ready.
func (s *Stack) RestartAgent() error {
	if err := s.Agent.Stop(time.Minute); err != nil {
		return err
	}
	p, err := restart(s.Agent, s.ClusterEnv(), s.agentArgs...)
	if err != nil {
		return err
	}
	s.Agent = p
	return s.waitAgentHealthy(2 * time.Minute)
}

// RestartControlPlane stops the stack's control plane and starts it again
// on the same address: it forgets every session it knew.
func (s *Stack) RestartControlPlane() error {
	if err := s.ControlPlane.Stop(time.Minute); err != nil {
		return err
	}
	p, err := restart(s.ControlPlane, append(s.ClusterEnv(), "REMOTE_HOSTS="+s.Agent.Addr), "--poll-interval", "200ms")
	if err != nil {
		return err
	}
	s.ControlPlane = p
	return s.waitAgentHealthy(2 * time.Minute)
}

// restart starts p's binary again on p's address, which may linger a
// moment after p stopped.
func restart(p *Process, env []string, args ...string) (*Process, error) {
	var np *Process
	err := testkit.Poll(10*time.Second, func() error {
		var err error
		np, err = start(p.Name, env, append([]string{"--addr", p.Addr}, args...)...)
		return err
	})
	if err != nil {
		return nil, err
	}
	return np, nil
}

// TestErrorsHideInternals points an edge at a control plane that is not
// there: the caller gets unavailable with a request id (also in the
// response header) and no internal address; the log has the detail.
func TestErrorsHideInternals(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	edge, err := start("edge", []string{"CODE_EXECUTION_HOST=http://" + dead}, "--addr", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { edge.Stop(30 * time.Second) })
	_, port, _ := net.SplitHostPort(dead)

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, edge.URL()+"/codemode.edge.v1.ExecutionService/Execute",
		bytes.NewReader([]byte(`{"language":"python","code":"print(1)"}`)))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	rid := res.Header.Get("X-Request-Id")
	if res.StatusCode != http.StatusServiceUnavailable || rid == "" || !strings.Contains(string(body), rid) {
		t.Errorf("HTTP %d, X-Request-Id %q, body %s: want 503 quoting the request id", res.StatusCode, rid, body)
	}
	if strings.Contains(string(body), "127.0.0.1") || strings.Contains(string(body), port) || strings.Contains(string(body), "dial") {
		t.Errorf("the error shows an internal address: %s", body)
	}
	for _, p := range protocols {
		c := edgev1connect.NewExecutionServiceClient(httpClient, edge.URL(), p.opts...)
		_, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"}))
		if connect.CodeOf(err) != connect.CodeUnavailable || strings.Contains(err.Error(), port) || !strings.Contains(err.Error(), "request id") {
			t.Errorf("%s: %v, want unavailable with a request id and no address", p.name, err)
		}
	}
	res2 := callTool(t, edge.URL()+"/mcp", "execute_code", map[string]any{"code": "print(1)"})
	if !res2.IsError || strings.Contains(testkit.ToolText(res2), port) || !strings.Contains(testkit.ToolText(res2), "request id") {
		t.Errorf("MCP: %s, want an error with a request id and no address", testkit.ToolText(res2))
	}
	// The log has the detail, under the request id.
	testkit.WaitFor(t, 10*time.Second, "the log to name the request id and the cause", func() bool {
		logs := edge.Logs()
		return strings.Contains(logs, rid) && strings.Contains(logs, port)
	})
}
