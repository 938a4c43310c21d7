package mcpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// BenchmarkExecuteCode calls execute_code over streamable HTTP, one client
// session, against a backend that answers at once: what one call costs the
// MCP layer of the edge (and the client in this process).
func BenchmarkExecuteCode(b *testing.B) {
	cfg := Config{Open: func(context.Context, http.Header) (Backend, string, error) {
		return &scripted{steps: []step{{out: "1\n"}}}, "req-1", nil
	}}
	withCode, _ := New(cfg).Handlers()
	srv := httptest.NewServer(withCode)
	b.Cleanup(srv.Close)
	cs := connectHTTP(b, srv.URL)
	p := &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"code": "print(1)"}}
	b.ReportAllocs()
	for b.Loop() {
		res, err := cs.CallTool(b.Context(), p)
		if err != nil || res.IsError {
			b.Fatalf("execute_code: %v %v", res, err)
		}
	}
}

// languageSwitch is a scripted backend whose languages can change, and
// which counts how often it is asked for them.
type languageSwitch struct {
	scripted
	mu    sync.Mutex
	langs []string
	asked int
}

func (l *languageSwitch) set(langs ...string) {
	l.mu.Lock()
	l.langs = langs
	l.mu.Unlock()
}

func (l *languageSwitch) Languages(context.Context) (*edgev1.ListLanguagesResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked++
	res := &edgev1.ListLanguagesResponse{Defaults: scriptedDefaults}
	for _, name := range l.langs {
		res.Languages = append(res.Languages, &executionv1.Language{Name: name, Version: "1"})
	}
	return res, nil
}

// TestServersShared checks that sessions share a server while the agents'
// languages stay the same; that when a new session comes after they
// change, every session, older ones too, is told the tool list changed
// and lists tools that say the new languages; and that the requests of a
// session do not ask for the languages. The agents' default language
// (bash, in scriptedDefaults) is at first not among the languages they
// run: the schema then has no default, rather than no tools.
func TestServersShared(t *testing.T) {
	backend := &languageSwitch{scripted: scripted{steps: []step{{out: "1\n"}}}}
	backend.set("python")
	s := New(Config{Open: func(context.Context, http.Header) (Backend, string, error) { return backend, "req-1", nil }})
	s.langs.ttl = 0 // ask on every new session
	withCode, _ := s.Handlers()
	srv := httptest.NewServer(withCode)
	t.Cleanup(srv.Close)
	changed := make(chan struct{}, 8)
	connect := func() *mcp.ClientSession {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, &mcp.ClientOptions{
			ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed <- struct{}{} },
		}).Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: srv.URL}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	run := func(cs *mcp.ClientSession) {
		t.Helper()
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"code": "print(1)"}})
		if err != nil || res.IsError {
			t.Fatalf("execute_code: %v %v", res, err)
		}
	}
	built := func() *mcp.Server {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.built[1].srv
	}

	a := connect()
	first := built()
	if first == nil {
		t.Fatal("no server kept after the first session began")
	}
	backend.mu.Lock()
	asked := backend.asked
	backend.mu.Unlock()
	for range 5 {
		run(a)
	}
	if got := enum(t, a); got != `["python"]` {
		t.Errorf("first session's languages %s", got)
	}
	if got := schemaOf(t, a); strings.Contains(got, `"default"`) {
		t.Errorf("a default that is not among the languages is in the schema: %s", got)
	}
	backend.mu.Lock()
	if backend.asked != asked {
		t.Errorf("a session's calls asked for the languages %d times", backend.asked-asked)
	}
	backend.mu.Unlock()
	connect()
	if built() != first {
		t.Error("a second session with the same languages got a new server")
	}

	backend.set("python", "bash")
	c := connect()
	if built() != first {
		t.Error("a session after the languages changed got another server")
	}
	if got := enum(t, c); got != `["python","bash"]` {
		t.Errorf("new session's languages %s, want python and bash", got)
	}
	if got := schemaOf(t, c); !strings.Contains(got, `"default":"bash"`) {
		t.Errorf("the agents' default is not in the schema: %s", got)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("no notifications/tools/list_changed after the languages changed")
	}
	run(a)
	if got := enum(t, a); got != `["python","bash"]` {
		t.Errorf("the first session, told the list changed, lists %s", got)
	}
}

// schemaOf is the input schema of cs's execute_code tool.
func schemaOf(t *testing.T, cs *mcp.ClientSession) string {
	t.Helper()
	tools, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if tool.Name == "execute_code" {
			b, _ := json.Marshal(tool.InputSchema)
			return string(b)
		}
	}
	t.Fatal("no execute_code tool")
	return ""
}

// enum is the languages' enum in cs's execute_code schema.
func enum(t *testing.T, cs *mcp.ClientSession) string {
	t.Helper()
	_, after, _ := strings.Cut(schemaOf(t, cs), `"enum":`)
	e, _, _ := strings.Cut(after, "]")
	return e + "]"
}
