package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/codemode-go/codemode/edge/internal/tenant"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/testkit"
)

// tenantRuns is a Backend whose runs print the tenant they run as, and
// which counts them by tenant.
type tenantRuns struct {
	scripted
	mu   sync.Mutex
	runs map[string]int
}

func (b *tenantRuns) total() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, r := range b.runs {
		n += r
	}
	return n
}

// open is an Opener as Local is: the tenant is the one of the current
// request's key.
func (b *tenantRuns) open(tenants *tenant.Resolver) Opener {
	return func(_ context.Context, h http.Header) (Backend, string, error) {
		t, err := tenants.Resolve(h)
		if err != nil {
			return nil, "", err
		}
		return &tenantRun{b, t}, "req-1", nil
	}
}

type tenantRun struct {
	*tenantRuns
	tenant string
}

func (r *tenantRun) ExecuteStream(_ context.Context, _ *executionv1.Execution, send func(*executionv1.Event) error) error {
	r.mu.Lock()
	r.runs[r.tenant]++
	r.mu.Unlock()
	return send(&executionv1.Event{Event: &executionv1.Event_Result{Result: &executionv1.Result{Stdout: r.tenant}}})
}

func (r *tenantRun) Execute(ctx context.Context, ex *executionv1.Execution) (*executionv1.Result, error) {
	var res *executionv1.Result
	err := r.ExecuteStream(ctx, ex, func(ev *executionv1.Event) error { res = ev.GetResult(); return nil })
	return res, err
}

// authenticated puts in front of h what the edge's server does: the
// tenant of the request's key goes into its context, and a request without
// a known key gets 401.
func authenticated(tenants *tenant.Resolver, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, err := tenants.Authenticate(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// keyTransport sends an Authorization header with every request ("": none).
type keyTransport struct{ auth string }

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if k.auth != "" {
		r.Header.Set("Authorization", k.auth)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// answer is an HTTP answer as a caller sees it.
type answer struct {
	status      int
	contentType string
	body        string
}

func (a answer) String() string {
	body := a.body
	if len(body) > 200 {
		body = body[:200] + "..."
	}
	return fmt.Sprintf("HTTP %d %s %q", a.status, a.contentType, body)
}

// send makes one raw MCP request: method and JSON-RPC body ("" for none),
// with the given Authorization header and session id.
func send(t *testing.T, url, method, body, auth, session string) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json, text/event-stream")
	if method == http.MethodGet {
		req.Header.Set("Accept", "text/event-stream")
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	req.Header.Set("Mcp-Session-Id", session)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	a := answer{status: res.StatusCode, contentType: res.Header.Get("Content-Type")}
	if res.StatusCode != http.StatusOK || method != http.MethodGet {
		// A GET that is let in is a stream that does not end: only its
		// status is read.
		b, _ := io.ReadAll(res.Body)
		a.body = string(b)
	}
	return a
}

// forgedRequests are requests of every method naming a session: a tool
// call (of tool), a tools/list, a ping, the stream (GET) and the end of
// the session (DELETE).
func forgedRequests(tool, arguments string) []struct{ name, method, body string } {
	return []struct{ name, method, body string }{
		{"tools/call", http.MethodPost, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + arguments + `}}`},
		{"tools/list", http.MethodPost, `{"jsonrpc":"2.0","id":8,"method":"tools/list"}`},
		{"ping", http.MethodPost, `{"jsonrpc":"2.0","id":9,"method":"ping"}`},
		{"GET", http.MethodGet, ""},
		{"DELETE", http.MethodDelete, ""},
	}
}

// TestSessionsBelongToWhoOpenedThem opens an MCP session as one caller and
// sends requests of every method in it with another caller's credentials,
// on both endpoints, with API keys and without: each is answered exactly
// as if the session did not exist, runs nothing, and leaves the session
// working for its owner. The owner's own raw requests still get in.
func TestSessionsBelongToWhoOpenedThem(t *testing.T) {
	t.Parallel()
	keyA, keyB := "ka-"+rand.Text(), "kb-"+rand.Text()
	keyed, err := tenant.New(map[string]string{keyA: "alpha", keyB: "beta"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name         string
		tenants      *tenant.Resolver
		owner, other string // Authorization headers
	}{
		{"keys", keyed, "Bearer " + keyA, "Bearer " + keyB},
		{"no keys", &tenant.Resolver{}, "", "Bearer someone-else"},
		{"no keys, two tokens", &tenant.Resolver{}, "Bearer mine", "Bearer theirs"},
	} {
		for _, door := range []ownerDoor{{"mcp", true, "execute_code", `{"code":"print(1)"}`}, {"mcp-no-code-execute", false, "list_languages", `{}`}} {
			t.Run(tc.name+"/"+door.name, func(t *testing.T) {
				t.Parallel()
				sessionBelongsToOwner(t, tc.tenants, tc.owner, tc.other, door)
			})
		}
	}
}

// ownerDoor is an MCP endpoint of TestSessionsBelongToWhoOpenedThem and
// the tool called through it with args.
type ownerDoor struct {
	name     string
	withCode bool
	tool     string
	args     string
}

// sessionBelongsToOwner opens a session at door with the Authorization
// header owner, sends forged requests naming it with other, and checks
// they get what an unknown session gets and run nothing.
func sessionBelongsToOwner(t *testing.T, tenants *tenant.Resolver, owner, other string, door ownerDoor) {
	backend := &tenantRuns{runs: map[string]int{}}
	withCode, withoutCode := New(Config{Open: backend.open(tenants)}).Handlers()
	h := withoutCode
	if door.withCode {
		h = withCode
	}
	srv := httptest.NewServer(authenticated(tenants, h))
	t.Cleanup(srv.Close)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "owner", Version: "1"}, nil).Connect(t.Context(),
		&mcp.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: &http.Client{Transport: keyTransport{owner}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	id := cs.ID()
	if id == "" {
		t.Fatal("the session has no id")
	}
	ownerTenant, _ := tenants.Resolve(http.Header{"Authorization": {owner}})

	for _, f := range forgedRequests(door.tool, door.args) {
		unknown := send(t, srv.URL, f.method, f.body, other, rand.Text())
		if unknown.status != http.StatusNotFound {
			t.Fatalf("%s on an unknown session: %s, want 404", f.name, unknown)
		}
		if got := send(t, srv.URL, f.method, f.body, other, id); got != unknown {
			t.Errorf("%s on another's session: %s, want what an unknown session gets: %s", f.name, got, unknown)
		}
	}
	if n := backend.total(); n != 0 {
		t.Errorf("the other caller's calls ran %d times", n)
	}
	ownerSessionUntouched(t, srv.URL, owner, ownerTenant, cs, door)
}

// ownerSessionUntouched checks that the session cs at url, opened with
// the Authorization header owner as ownerTenant, is untouched: its
// owner's client and raw requests still work in it, and end it.
func ownerSessionUntouched(t *testing.T, url, owner, ownerTenant string, cs *mcp.ClientSession, door ownerDoor) {
	id := cs.ID()
	if _, err := cs.ListTools(t.Context(), nil); err != nil {
		t.Errorf("tools/list by the owner after the other caller's requests: %v", err)
	}
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: door.tool, Arguments: json.RawMessage(door.args)})
	if err != nil || res.IsError {
		t.Errorf("%s by the owner: %v %v", door.tool, res, err)
	}
	if door.withCode && testkit.ToolText(res) != ownerTenant {
		t.Errorf("the owner's run ran as %q, want %q", testkit.ToolText(res), ownerTenant)
	}
	if got := send(t, url, http.MethodPost, `{"jsonrpc":"2.0","id":10,"method":"ping"}`, owner, id); got.status != http.StatusOK {
		t.Errorf("the owner's raw ping: %s", got)
	}
	if got := send(t, url, http.MethodDelete, "", owner, id); got.status != http.StatusNoContent {
		t.Errorf("the owner's DELETE: %s", got)
	}
	if got := send(t, url, http.MethodPost, `{"jsonrpc":"2.0","id":11,"method":"ping"}`, owner, id); got.status != http.StatusNotFound {
		t.Errorf("a ping after the owner's DELETE: %s, want 404", got)
	}
}
