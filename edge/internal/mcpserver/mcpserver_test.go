package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/edge/internal/directtools"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/apicatalog"
	"github.com/codemode-go/codemode/internal/testkit"
)

// scripted is a Backend whose runs follow a script: the end-to-end tests
// in edge/e2e drive the real one; these pin down timing, which a real
// sandbox cannot hold steady. Its API calls go to calls, a real
// directtools.Service, as the tenant "t".
type scripted struct {
	steps     []step
	cancelled chan struct{} // closed when a run sees its context end
	once      sync.Once
	calls     *directtools.Service
}

func (s *scripted) CallAPI(ctx context.Context, tool *apicatalog.Tool, args []byte) (*directtools.Response, error) {
	if s.calls == nil {
		return nil, errScripted
	}
	return s.calls.Call(ctx, directtools.Call{Tool: tool, Arguments: args, Tenant: "t", RequestID: "req-1"})
}

// step is a pause, then a chunk of output.
type step struct {
	wait time.Duration
	out  string
}

func (s *scripted) ExecuteStream(ctx context.Context, _ *executionv1.Execution, send func(*executionv1.Event) error) error {
	start := time.Now()
	for _, st := range s.steps {
		select {
		case <-time.After(st.wait):
		case <-ctx.Done():
			s.once.Do(func() { close(s.cancelled) })
			return ctx.Err()
		}
		if err := send(&executionv1.Event{Event: &executionv1.Event_Stdout{Stdout: st.out}}); err != nil {
			return err
		}
	}
	return send(&executionv1.Event{Event: &executionv1.Event_Result{Result: &executionv1.Result{Duration: durationpb.New(time.Since(start))}}})
}

func (s *scripted) Execute(ctx context.Context, ex *executionv1.Execution) (*executionv1.Result, error) {
	var out strings.Builder
	var res *executionv1.Result
	err := s.ExecuteStream(ctx, ex, func(ev *executionv1.Event) error {
		out.WriteString(ev.GetStdout())
		if r := ev.GetResult(); r != nil {
			res = r
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.Stdout = out.String()
	return res, nil
}

var errScripted = errors.New("not scripted")

func (s *scripted) CreateSession(context.Context, string) (*executionv1.Session, error) {
	return nil, errScripted
}
func (s *scripted) CloseSession(context.Context, string) error { return errScripted }
func (s *scripted) ListFiles(context.Context, string, string) ([]*executionv1.FileInfo, bool, error) {
	return nil, false, errScripted
}
func (s *scripted) ReadFile(context.Context, string, string) (*executionv1.File, error) {
	return nil, errScripted
}
func (s *scripted) WriteFile(context.Context, string, *executionv1.File) error { return errScripted }
func (s *scripted) Languages(context.Context) (*edgev1.ListLanguagesResponse, error) {
	return &edgev1.ListLanguagesResponse{
		Languages: []*executionv1.Language{{Name: "python", Version: "3.11.2", SessionState: "interpreter"}, {Name: "bash", Version: "5.2", SessionState: "shell"}},
		Defaults:  scriptedDefaults,
	}, nil
}

// scriptedDefaults are unlike the agents' usual ones, so that a description
// that says the usual ones without reading these fails TestDescriptionsSayTheAgentsDefaults.
var scriptedDefaults = &executionv1.Defaults{
	Language: "bash", Timeout: durationpb.New(7 * time.Second), MaxTimeout: durationpb.New(70 * time.Second),
	MemoryBytes: 3 << 20, OutputBytes: 5 << 10, SessionIdleTimeout: durationpb.New(2 * time.Minute),
}

// TestDescriptionsSayTheAgentsDefaults checks that the tools describe the
// limits and the default language the agents report, not numbers of their
// own.
func TestDescriptionsSayTheAgentsDefaults(t *testing.T) {
	cs, _ := connectScripted(t, &scripted{}, Config{})
	tools, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if tool.Name != "execute_code" {
			continue
		}
		for _, want := range []string{"by default 7s", "at most 1m10s", "3 MiB of memory", "5 KiB of output", "after 2m0s without a run", "(python, bash) variables"} {
			if !strings.Contains(tool.Description, want) {
				t.Errorf("execute_code's description lacks %q: %s", want, tool.Description)
			}
		}
		b, _ := json.Marshal(tool.InputSchema)
		if !strings.Contains(string(b), `"default":"bash"`) || !strings.Contains(string(b), `"enum":["python","bash"]`) {
			t.Errorf("execute_code's schema does not default to the agents' language: %s", b)
		}
		return
	}
	t.Fatal("no execute_code tool")
}

type notes struct {
	mu   sync.Mutex
	list []string
}

func (n *notes) add(s string) {
	n.mu.Lock()
	n.list = append(n.list, s)
	n.mu.Unlock()
}

func (n *notes) get() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.list...)
}

// connectHTTP opens an MCP client session, with the SDK's client, to the
// streamable HTTP endpoint at url; the test's cleanup closes it.
func connectHTTP(t testing.TB, url string) *mcp.ClientSession {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
		Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// connectScripted serves the tools over b in memory and returns a client
// session that records progress messages.
func connectScripted(t *testing.T, b Backend, cfg Config) (*mcp.ClientSession, *notes) {
	t.Helper()
	cfg.Open = func(context.Context, http.Header) (Backend, string, error) { return b, "req-1", nil }
	srv := New(cfg).Server(t.Context(), nil, true)
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(t.Context(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	got := &notes{}
	client := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			got.add(req.Params.Message)
		},
	})
	cs, err := client.Connect(t.Context(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs, got
}

func callWithProgress(ctx context.Context, cs *mcp.ClientSession) (*mcp.CallToolResult, error) {
	p := &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"code": "x"}}
	p.SetProgressToken("tok")
	return cs.CallTool(ctx, p)
}

// TestProgressCoalescesAndBeats checks that output that comes within one
// interval goes out as one notification, that a silent run gets heartbeats,
// and that the result still has the whole output.
func TestProgressCoalescesAndBeats(t *testing.T) {
	b := &scripted{cancelled: make(chan struct{}), steps: []step{
		{0, "line 0"}, {0, "\n"}, // one line, written in two pieces
		{300 * time.Millisecond, "line 1\n"},
		{900 * time.Millisecond, "line 2\n"}, // silent long enough for heartbeats
	}}
	cs, got := connectScripted(t, b, Config{ProgressInterval: 50 * time.Millisecond, Heartbeat: 200 * time.Millisecond})
	res, err := callWithProgress(t.Context(), cs)
	if err != nil || res.IsError {
		t.Fatalf("execute_code: %v %v", res, err)
	}
	// The client may hand the last notification to its handler after the
	// result: wait for it, boundedly.
	want := []string{"line 0\n", "line 1\n", "line 2\n"}
	var (
		msgs   []string
		output []string
		beats  int
	)
	testkit.Until(2*time.Second, func() bool {
		msgs, output, beats = got.get(), nil, 0
		for _, m := range msgs {
			if strings.HasPrefix(m, "[running for") {
				beats++
			} else {
				output = append(output, m)
			}
		}
		return len(output) >= len(want)
	})
	if strings.Join(output, "|") != strings.Join(want, "|") {
		t.Errorf("progress output %q, want %q (all messages %q)", output, want, msgs)
	}
	if beats < 2 {
		t.Errorf("%d heartbeats in a 900 ms silence with a 200 ms heartbeat, want 2 or more (messages %q)", beats, msgs)
	}
	var out ExecuteOutput
	raw, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(raw, &out)
	if out.Stdout != "line 0\nline 1\nline 2\n" {
		t.Errorf("result stdout %q", out.Stdout)
	}
}

// TestProgressBoundsMessages checks that a flood of output is cut in the
// notifications, saying so, while the result keeps all of it.
func TestProgressBoundsMessages(t *testing.T) {
	big := strings.Repeat("y", 3*maxProgressMessage)
	b := &scripted{cancelled: make(chan struct{}), steps: []step{{0, big}}}
	cs, got := connectScripted(t, b, Config{ProgressInterval: 20 * time.Millisecond})
	res, err := callWithProgress(t.Context(), cs)
	if err != nil || res.IsError {
		t.Fatalf("execute_code: %v %v", res, err)
	}
	msgs := got.get()
	if len(msgs) != 1 || len(msgs[0]) > maxProgressMessage+100 || !strings.Contains(msgs[0], "bytes more") {
		t.Errorf("one notification of at most %d bytes saying what was cut: got %d messages, first %.80q...", maxProgressMessage, len(msgs), msgs)
	}
	if !strings.Contains(res.Content[0].(*mcp.TextContent).Text, big) {
		t.Error("the result lost output")
	}
}

// TestCancelledCallEndsTheRun checks that a client's cancellation reaches
// the backend's run.
func TestCancelledCallEndsTheRun(t *testing.T) {
	b := &scripted{cancelled: make(chan struct{}), steps: []step{{0, "started\n"}, {time.Minute, "never\n"}}}
	cs, got := connectScripted(t, b, Config{ProgressInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := callWithProgress(ctx, cs)
		errc <- err
	}()
	testkit.WaitFor(t, 10*time.Second, "progress", func() bool { return len(got.get()) > 0 })
	cancel()
	if err := <-errc; err == nil {
		t.Error("a cancelled call returned no error")
	}
	select {
	case <-b.cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not see the cancellation within 10 s")
	}
}

// TestProtocolErrors checks the JSON-RPC answers to what the SDK alone
// refuses with plain HTTP errors.
func TestProtocolErrors(t *testing.T) {
	withCode, _ := New(Config{Open: func(context.Context, http.Header) (Backend, string, error) {
		return &scripted{}, "", nil
	}}).Handlers()
	limited := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 1<<10)
		withCode.ServeHTTP(w, r)
	})
	srv := httptest.NewServer(limited)
	defer srv.Close()
	post := func(session, body string, chunked bool) (*http.Response, map[string]any) {
		var rd io.Reader = strings.NewReader(body)
		if chunked {
			rd = io.MultiReader(rd) // no length: sent chunked, cut by MaxBytesReader
		}
		req, _ := http.NewRequest(http.MethodPost, srv.URL, rd)
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
		s := string(b)
		if i := strings.Index(s, "data: "); i >= 0 {
			s = strings.SplitN(s[i+6:], "\n", 2)[0]
		}
		var m map[string]any
		_ = json.Unmarshal([]byte(s), &m)
		return res, m
	}
	code := func(m map[string]any) any {
		e, _ := m["error"].(map[string]any)
		return e["code"]
	}
	res, _ := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, false)
	session := res.Header.Get("Mcp-Session-Id")
	if session == "" {
		t.Fatalf("initialize: %s", res.Status)
	}
	post(session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, false)

	if res, m := post(session, `{"jsonrpc":"2.0","id":2,"method":"no/such"}`, false); res.StatusCode != http.StatusOK || code(m) != float64(codeMethodNotFound) || m["id"] != float64(2) {
		t.Errorf("unknown method: %s %v", res.Status, m)
	}
	if res, m := post(session, `{"jsonrpc":`, false); res.StatusCode != http.StatusBadRequest || code(m) != float64(codeParseError) {
		t.Errorf("bad JSON: %s %v", res.Status, m)
	}
	if res, m := post(session, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"execute_code","arguments":{"code":"`+strings.Repeat("x", 2<<10)+`"}}}`, true); res.StatusCode != http.StatusRequestEntityTooLarge || code(m) != float64(codeInvalidRequest) {
		t.Errorf("oversized body: %s %v", res.Status, m)
	}
	if res, m := post(session, `{"jsonrpc":"2.0","id":4,"method":"tools/list"}`, false); res.StatusCode != http.StatusOK || m["result"] == nil {
		t.Errorf("tools/list after the errors: %s %v", res.Status, m)
	}
}

// TestToolSchemas checks the language enums, the default, and annotations
// that are true.
func TestToolSchemas(t *testing.T) {
	cs, _ := connectScripted(t, &scripted{}, Config{})
	list, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]*mcp.Tool{}
	for _, tool := range list.Tools {
		tools[tool.Name] = tool
	}
	raw, _ := json.Marshal(tools["execute_code"].InputSchema)
	if !strings.Contains(string(raw), `"enum":["python","bash"]`) || !strings.Contains(string(raw), `"default":"bash"`) {
		t.Errorf("execute_code input schema %s: want language enum [python bash] defaulting to the agents' bash", raw)
	}
	if !strings.Contains(tools["execute_code"].Description, "python (3.11.2)") {
		t.Errorf("execute_code description does not name the versions: %s", tools["execute_code"].Description)
	}
	for _, name := range []string{"read_file", "list_files", "list_languages"} {
		a := tools[name].Annotations
		if a == nil || !a.ReadOnlyHint || !a.IdempotentHint || a.OpenWorldHint == nil || *a.OpenWorldHint {
			t.Errorf("%s annotations %+v: want read-only, idempotent, closed world", name, a)
		}
	}
	if a := tools["execute_code"].Annotations; a.ReadOnlyHint || a.IdempotentHint || *a.OpenWorldHint {
		t.Errorf("execute_code annotations %+v: want not read-only, not idempotent, closed world", a)
	}
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"code": "x", "language": "cobol"}})
	if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "python") {
		t.Errorf("a bad language: %v %v, want isError naming the valid ones", res, err)
	}
}
