package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// stdioSession launches `edge mcp-stdio` against edgeURL with key, as a
// desktop client does, and connects the Go SDK's client to it.
func stdioSession(t *testing.T, edgeURL, key string, extra ...string) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "edge"), append([]string{"mcp-stdio", "--url", edgeURL}, extra...)...)
	cmd.Env = []string{"CODEMODE_API_KEY=" + key}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e-stdio", Version: "1"}, nil)
	cs, err := client.Connect(t.Context(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to edge mcp-stdio: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() {
		cs.Close()
		if t.Failed() {
			t.Logf("edge mcp-stdio stderr:\n%s", stderr.String())
		}
	})
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

func structured(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	b, _ := json.Marshal(res.StructuredContent)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
	return m
}

// TestMCPStdio launches the stdio mode with the Go SDK's CommandTransport
// in front of an edge with API keys: it lists the tools of /mcp, runs
// Python, keeps state in a session as the key's tenant, and a wrong key
// gets tool errors, not results.
func TestMCPStdio(t *testing.T) {
	t.Parallel()
	s := shared(t)
	edge, keyA, keyB := keyedEdge(t, s)
	cs := stdioSession(t, edge.URL(), keyA)

	tools, err := cs.ListTools(t.Context(), &mcp.ListToolsParams{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		names = append(names, tool.Name)
	}
	if got := strings.Join(names, " "); !strings.Contains(got, "execute_code") || !strings.Contains(got, "create_session") || !strings.Contains(got, "close_session") {
		t.Fatalf("tools over stdio: %s", got)
	}

	res := call(t, cs, "execute_code", map[string]any{"code": "print(6*7)"})
	if res.IsError || structured(t, res)["stdout"] != "42\n" {
		t.Fatalf("execute_code over stdio: isError=%v %q", res.IsError, testkit.ToolText(res))
	}

	sess := call(t, cs, "create_session", map[string]any{"language": "python"})
	id, _ := structured(t, sess)["session_id"].(string)
	if sess.IsError || id == "" {
		t.Fatalf("create_session: isError=%v %q", sess.IsError, testkit.ToolText(sess))
	}
	call(t, cs, "execute_code", map[string]any{"session_id": id, "code": "kept = 'across calls'"})
	if r := call(t, cs, "execute_code", map[string]any{"session_id": id, "code": "print(kept)"}); structured(t, r)["stdout"] != "across calls\n" {
		t.Errorf("session state over stdio: %q", testkit.ToolText(r))
	}

	// The session is tenant A's: tenant B's stdio server does not find it.
	other := stdioSession(t, edge.URL(), keyB)
	if r := call(t, other, "execute_code", map[string]any{"session_id": id, "code": "print(kept)"}); !r.IsError && strings.Contains(testkit.ToolText(r), "across calls") {
		t.Errorf("tenant B read tenant A's session over stdio: %q", testkit.ToolText(r))
	}

	if r := call(t, cs, "close_session", map[string]any{"session_id": id}); r.IsError {
		t.Errorf("close_session: %q", testkit.ToolText(r))
	}
	if r := call(t, cs, "execute_code", map[string]any{"session_id": id, "code": "print(1)"}); !r.IsError || !strings.Contains(testkit.ToolText(r), "closed") {
		t.Errorf("a run in a closed session: isError=%v %q, want isError saying it was closed", r.IsError, testkit.ToolText(r))
	}

	bad := stdioSession(t, edge.URL(), "not-a-key")
	if r := call(t, bad, "execute_code", map[string]any{"code": "print(1)"}); !r.IsError || !strings.Contains(testkit.ToolText(r), "unauthenticated") {
		t.Errorf("a wrong key: isError=%v %q, want an unauthenticated tool error", r.IsError, testkit.ToolText(r))
	}
}

// rpcPost posts one JSON-RPC body to an MCP endpoint and returns the
// status and the decoded error object, if any.
func rpcPost(t *testing.T, endpoint, session, body string) (status int, rpcErr map[string]any, raw string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, endpoint, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var msg struct {
		Error map[string]any `json:"error"`
	}
	s := string(b)
	// A response may come as server-sent events: take the data line.
	if i := strings.Index(s, "data: "); i >= 0 {
		s = strings.TrimSpace(strings.SplitN(s[i+len("data: "):], "\n", 2)[0])
	}
	_ = json.Unmarshal([]byte(s), &msg)
	return res.StatusCode, msg.Error, string(b)
}

// TestMCPProtocolErrors checks the corners where the SDK alone answers
// with plain HTTP errors: an unknown method gets a JSON-RPC error -32601,
// a body that is not JSON a parse error, and a body over the edge's limit
// a JSON-RPC error with HTTP 413.
func TestMCPProtocolErrors(t *testing.T) {
	t.Parallel()
	s := shared(t)
	endpoint := s.Edge.URL() + "/mcp"

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, endpoint, strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	session := res.Header.Get("Mcp-Session-Id")
	if res.StatusCode != http.StatusOK || session == "" {
		t.Fatalf("initialize: %s, session %q", res.Status, session)
	}
	rpcPost(t, endpoint, session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)

	status, rpcErr, raw := rpcPost(t, endpoint, session, `{"jsonrpc":"2.0","id":7,"method":"codemode/nonexistent","params":{}}`)
	if rpcErr == nil || rpcErr["code"] != float64(-32601) {
		t.Errorf("unknown method: HTTP %d %s, want a JSON-RPC error -32601", status, raw)
	}
	if !strings.Contains(raw, `"id":7`) {
		t.Errorf("the error does not answer id 7: %s", raw)
	}

	status, rpcErr, raw = rpcPost(t, endpoint, session, `{"jsonrpc":"2.0","id":8,"method":`)
	if status != http.StatusBadRequest || rpcErr == nil || rpcErr["code"] != float64(-32700) {
		t.Errorf("malformed JSON: HTTP %d %s, want 400 with a JSON-RPC error -32700", status, raw)
	}

	// A tools/call whose body is over the edge's 8 MiB limit.
	big := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"execute_code","arguments":{"code":"` + strings.Repeat("x", 9<<20) + `"}}}`
	status, rpcErr, raw = rpcPost(t, endpoint, session, big)
	if status != http.StatusRequestEntityTooLarge || rpcErr == nil || rpcErr["code"] != float64(-32600) || !strings.Contains(rpcErr["message"].(string), "limit") {
		t.Errorf("oversized call: HTTP %d %.300s, want 413 with a JSON-RPC error naming the limit", status, raw)
	}

	// The session still works after all that.
	status, rpcErr, raw = rpcPost(t, endpoint, session, `{"jsonrpc":"2.0","id":10,"method":"tools/list","params":{}}`)
	if status != http.StatusOK || rpcErr != nil || !strings.Contains(raw, "execute_code") {
		t.Errorf("tools/list after the errors: HTTP %d %.300s", status, raw)
	}
}

// TestDefaultLanguageOnEveryDoor runs code that names no language through
// Connect, gRPC, gRPC-Web, MCP and /run, and a session created with none:
// every door runs it as python.
func TestDefaultLanguageOnEveryDoor(t *testing.T) {
	t.Parallel()
	s := shared(t)
	const code = "import sys; print(sys.version_info[0])"
	for _, p := range protocols {
		c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL(), p.opts...)
		res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Code: code}))
		if err != nil || res.Msg.GetResult().GetStdout() != "3\n" {
			t.Errorf("%s with no language: %v, %v", p.name, res, err)
		}
	}
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	sess, err := c.CreateSession(t.Context(), connect.NewRequest(&edgev1.CreateSessionRequest{}))
	if err != nil || sess.Msg.GetSession().GetLanguage() != "python" {
		t.Errorf("CreateSession with no language: %v, %v", sess, err)
	} else {
		c.CloseSession(t.Context(), connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: sess.Msg.GetSession().GetId()}))
	}
	if res := callTool(t, s.Edge.URL()+"/mcp", "execute_code", map[string]any{"code": code}); res.IsError || testkit.ToolText(res) != "3\n" {
		t.Errorf("mcp with no language: isError=%v %q", res.IsError, testkit.ToolText(res))
	}
	if status, out := seedRun(t, s.Edge, "", "", code, ""); status != http.StatusOK || out.Output != "3\n" {
		t.Errorf("/run with no language: HTTP %d %+v", status, out)
	}
}

// BenchmarkMCPvsConnect runs the same program through the same edge over
// MCP's execute_code (one client session, streamable HTTP) and Connect's
// Execute, in turns, and reports both p50s and their ratio.
func BenchmarkMCPvsConnect(b *testing.B) {
	dockertest.Need(b)
	s, err := StartStack("e2e-bench-mcp", "--min-active", "4")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Stop)
	client := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil)
	cs, err := client.Connect(b.Context(), &mcp.StreamableClientTransport{Endpoint: s.Edge.URL() + "/mcp"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cs.Close() })
	c := edgev1connect.NewExecutionServiceClient(server.NewClient(), s.Edge.URL())
	pairedLatency(b,
		pair{"mcp", func() {
			res, err := cs.CallTool(b.Context(), &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"code": "print(1)"}})
			if err != nil || res.IsError || testkit.ToolText(res) != "1\n" {
				b.Fatalf("execute_code: %v %v", res, err)
			}
		}},
		pair{"connect", func() {
			res, err := c.Execute(b.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Code: "print(1)"}))
			if err != nil || res.Msg.GetResult().GetStdout() != "1\n" {
				b.Fatalf("Execute: %v %v", res, err)
			}
		}})
}
