package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/testkit"
)

// protocols are the three ways a connect-go client can call the edge.
var protocols = []struct {
	name string
	opts []connect.ClientOption
}{
	{"connect", nil},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	{"grpcweb", []connect.ClientOption{connect.WithGRPCWeb()}},
}

func TestConnectJSONLikeCurl(t *testing.T) {
	t.Parallel()
	s := shared(t)
	var out struct {
		Result struct {
			Stdout   string `json:"stdout"`
			ExitCode int    `json:"exitCode"`
		} `json:"result"`
	}
	code := postJSONWith(t, s.Edge.URL()+"/codemode.edge.v1.ExecutionService/Execute", "", `{"language":"python","code":"print(6*7)"}`, &out)
	if code != http.StatusOK || out.Result.Stdout != "42\n" || out.Result.ExitCode != 0 {
		t.Fatalf("got HTTP %d %+v, want 200 stdout %q exit 0\n%s", code, out, "42\n", s.Logs())
	}
}

func TestEveryProtocol(t *testing.T) {
	t.Parallel()
	s := shared(t)
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL(), p.opts...)
			res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(6*7)"}))
			if err != nil {
				t.Fatalf("execute: %v\n%s", err, s.Logs())
			}
			if r := res.Msg.GetResult(); r.GetStdout() != "42\n" || r.GetExitCode() != 0 {
				t.Fatalf("result %v, want stdout 42 exit 0", r)
			}
		})
	}
}

func TestStreamOverEveryProtocol(t *testing.T) {
	t.Parallel()
	s := shared(t)
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL(), p.opts...)
			st, err := c.ExecuteStream(t.Context(), connect.NewRequest(&edgev1.ExecuteStreamRequest{
				Language: "bash", Code: "echo one; echo two >&2; exit 3",
			}))
			if err != nil {
				t.Fatal(err)
			}
			var stdout, stderr string
			var exit int32 = -100
			for st.Receive() {
				ev := st.Msg().GetEvent()
				stdout += ev.GetStdout()
				stderr += ev.GetStderr()
				if r := ev.GetResult(); r != nil {
					exit = r.GetExitCode()
				}
			}
			if err := st.Err(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			if stdout != "one\n" || stderr != "two\n" || exit != 3 {
				t.Fatalf("stdout %q stderr %q exit %d, want one/two/3", stdout, stderr, exit)
			}
		})
	}
}

// TestBufCurlWithReflection calls the edge the way grpcurl and buf curl
// users do: plain gRPC over h2c, with the schema taken from server reflection.
func TestBufCurlWithReflection(t *testing.T) {
	t.Parallel()
	s := shared(t)
	buf := strings.Fields(os.Getenv("BUF"))
	if len(buf) == 0 {
		buf = []string{"npx", "--yes", "@bufbuild/buf@1.75.0"}
	}
	args := append(buf[1:], "curl", "--protocol", "grpc", "--http2-prior-knowledge",
		"--data", `{"language":"python","code":"print(6*7)"}`,
		s.Edge.URL()+"/codemode.edge.v1.ExecutionService/Execute")
	out, err := exec.CommandContext(t.Context(), buf[0], args...).CombinedOutput()
	if err != nil {
		t.Fatalf("buf curl: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), `"stdout": "42\n"`) {
		t.Fatalf("buf curl output %s lacks stdout 42", out)
	}
}

func TestInvalidRequests(t *testing.T) {
	t.Parallel()
	s := shared(t)
	cases := []struct {
		name, language, code, want string
	}{
		{"unknown language", "cobol", "DISPLAY 'HI'.", "language"},
		{"empty code", "python", "", "code"},
		{"oversized code", "python", "#" + strings.Repeat("x", 300<<10), "code"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, p := range protocols {
				c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL(), p.opts...)
				_, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: tc.language, Code: tc.code}))
				if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%s: got %v, want invalid_argument about %s", p.name, err, tc.want)
				}
			}
			res := callTool(t, s.Edge.URL()+"/mcp", "execute_code", map[string]any{"language": tc.language, "code": tc.code})
			if !res.IsError || !strings.Contains(testkit.ToolText(res), tc.want) {
				t.Errorf("mcp: isError=%v text %q, want isError about %s", res.IsError, testkit.ToolText(res), tc.want)
			}
			var out struct{ Error string }
			body := `{"language":` + quote(tc.language) + `,"code":` + quote(tc.code) + `}`
			for _, door := range []struct{ url, key string }{{s.Edge.URL(), ""}, {s.ControlPlane.URL(), s.Secret}} {
				if code := postJSONWith(t, door.url+"/run", door.key, body, &out); code != http.StatusBadRequest || !strings.Contains(out.Error, tc.want) {
					t.Errorf("%s/run: HTTP %d error %q, want 400 about %s", door.url, code, out.Error, tc.want)
				}
			}
		})
	}
}

func TestMCP(t *testing.T) {
	t.Parallel()
	s := shared(t)
	t.Run("tools", func(t *testing.T) {
		names := listTools(t, s.Edge.URL()+"/mcp")
		if !strings.Contains(strings.Join(names, ","), "execute_code") {
			t.Fatalf("/mcp tools %v lack execute_code", names)
		}
		for _, n := range listTools(t, s.Edge.URL()+"/mcp-no-code-execute") {
			if strings.Contains(n, "execute") || strings.Contains(n, "run") {
				t.Fatalf("/mcp-no-code-execute offers %q", n)
			}
		}
	})
	t.Run("execute_code", func(t *testing.T) {
		res := callTool(t, s.Edge.URL()+"/mcp", "execute_code", map[string]any{"language": "python", "code": "print(6*7)"})
		if res.IsError || !strings.Contains(testkit.ToolText(res), "42") {
			t.Fatalf("result isError=%v %q", res.IsError, testkit.ToolText(res))
		}
		sc, _ := res.StructuredContent.(map[string]any)
		if sc["stdout"] != "42\n" || sc["exit_code"] != float64(0) {
			t.Fatalf("structured content %v", res.StructuredContent)
		}
	})
	t.Run("failing program is a result", func(t *testing.T) {
		res := callTool(t, s.Edge.URL()+"/mcp", "execute_code", map[string]any{"language": "python", "code": "import sys\nsys.exit(4)"})
		if res.IsError || !strings.Contains(testkit.ToolText(res), "exit code 4") {
			t.Fatalf("result isError=%v %q, want a result saying exit code 4", res.IsError, testkit.ToolText(res))
		}
	})
}

func TestSeedRun(t *testing.T) {
	t.Parallel()
	s := shared(t)
	var out struct{ Output, Error string }
	// The control plane's copies are internal: they take the cluster secret.
	code := postJSONWith(t, s.ControlPlane.URL()+"/run", s.Secret, `{"code":"print(6*7)","language":"python","sessionId":""}`, &out)
	if code != http.StatusOK || out.Output != "42\n" || out.Error != "" {
		t.Fatalf("HTTP %d %+v", code, out)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, s.ControlPlane.URL()+"/status", nil)
	req.Header.Set("Authorization", "Bearer "+s.Secret)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /status: %s", res.Status)
	}
}

func TestTimeoutKillsAndAgentKeepsServing(t *testing.T) {
	t.Parallel()
	s := shared(t)
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	start := time.Now()
	res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{
		Language: "python", Code: "while True: pass", Timeout: durationpb.New(2 * time.Second),
	}))
	elapsed := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Msg.GetResult().GetTimedOut() {
		t.Fatalf("result %v, want timed_out", res.Msg.GetResult())
	}
	// The run's own duration: the wall time also holds any wait for a
	// sandbox while other tests keep the shared stack busy.
	if d := res.Msg.GetResult().GetDuration().AsDuration(); d > 4*time.Second {
		t.Errorf("timed-out run took %s in its sandbox (%s in all), want about 2s", d, elapsed)
	}
	res, err = c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print('still here')"}))
	if err != nil || res.Msg.GetResult().GetStdout() != "still here\n" {
		t.Fatalf("next run: %v %v", res, err)
	}
}

func TestPythonRunsUnderPython(t *testing.T) {
	t.Parallel()
	s := shared(t)
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	// A first line that sh cannot parse: it runs only under Python.
	code := "from __future__ import annotations\nimport sys\nprint(sys.version_info[0])"
	res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: code}))
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Msg.GetResult(); r.GetStdout() != "3\n" || r.GetExitCode() != 0 {
		t.Fatalf("result %v", r)
	}
}

func TestNoNetworkInside(t *testing.T) {
	t.Parallel()
	s := shared(t)
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{
		// /proc/net/dev lists every interface the sandbox's network stack has.
		Language: "python", Code: "lines = open('/proc/net/dev').read().splitlines()[2:]\nprint(' '.join(sorted(l.split(':')[0].strip() for l in lines)))",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(res.Msg.GetResult().GetStdout()); got != "lo" {
		t.Fatalf("interfaces inside the sandbox: %q (stderr %q), want only lo", got, res.Msg.GetResult().GetStderr())
	}
}

func TestSessionsAreScopedAndStateful(t *testing.T) {
	t.Parallel()
	s := shared(t)
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	sess, err := c.CreateSession(t.Context(), connect.NewRequest(&edgev1.CreateSessionRequest{Language: "python"}))
	if err != nil {
		t.Fatal(err)
	}
	id := sess.Msg.GetSession().GetId()
	defer c.CloseSession(t.Context(), connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: id}))
	run := func(code string) string {
		res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: code, SessionId: id}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetResult().GetStdout() + res.Msg.GetResult().GetStderr()
	}
	run("x = 41\nopen('note.txt', 'w').write('kept')")
	if got := run("print(x + 1)\nprint(open('note.txt').read())"); got != "42\nkept\n" {
		t.Fatalf("session state: %q, want 42 and kept", got)
	}
	// A stateless run does not see the session's files.
	res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "bash", Code: "ls /workspace"}))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(res.Msg.GetResult().GetStdout(), "note.txt") {
		t.Fatal("a stateless run sees a session's file")
	}
	if _, err := c.CloseSession(t.Context(), connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: id})); err != nil {
		t.Fatalf("close: %v", err)
	}
}

func listTools(t *testing.T, endpoint string) []string {
	t.Helper()
	cs := mcpSession(t, endpoint)
	res, err := cs.ListTools(t.Context(), &mcp.ListToolsParams{})
	if err != nil {
		t.Fatalf("list tools at %s: %v", endpoint, err)
	}
	var names []string
	for _, tool := range res.Tools {
		names = append(names, tool.Name)
	}
	return names
}

func callTool(t *testing.T, endpoint, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	cs := mcpSession(t, endpoint)
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("call %s at %s: protocol error %v", name, endpoint, err)
	}
	return res
}

func mcpSession(t *testing.T, endpoint string) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	cs, err := client.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint}, nil)
	if err != nil {
		t.Fatalf("connect MCP %s: %v", endpoint, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
