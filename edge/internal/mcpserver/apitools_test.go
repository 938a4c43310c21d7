package mcpserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/codemode-go/codemode/edge/internal/directtools"
	"github.com/codemode-go/codemode/edge/internal/ratelimit"
	"github.com/codemode-go/codemode/edge/internal/tenant"
	"github.com/codemode-go/codemode/internal/apicatalog"
	"github.com/codemode-go/codemode/internal/testkit/apistest"
)

const githubToken = "ghp_mcptest0123456789abcdefghijklmnop"

var githubTools = []string{"github_list_user_closed_pull_requests", "github_list_user_issues", "github_list_user_pull_requests", "github_list_user_repos"}

// apiServers serves both MCP endpoints over HTTP on loopback, with the
// shipped GitHub declaration pointed at a fake GitHub and a token, and
// returns a client session of each.
func apiServers(t *testing.T, opts ...directtools.Option) (fake *apistest.GitHub, withCode, withoutCode *mcp.ClientSession) {
	t.Helper()
	fake = apistest.NewGitHub(t)
	catalog, err := apicatalog.Parse(apicatalog.DefaultDeclaration(), apicatalog.WithBaseURL("github", fake.URL),
		apicatalog.WithGetenv(func(k string) string {
			if k == "CODEMODE_GITHUB_TOKEN" {
				return githubToken
			}
			return ""
		}))
	if err != nil {
		t.Fatal(err)
	}
	b := &scripted{calls: directtools.New(nil, opts...)}
	egress, err := tenant.ParseEgress([]byte(`{"default": {"allow": [{"host": "github.api.codemode"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	code, noCode := New(Config{APIs: catalog, Egress: egress, Open: func(context.Context, http.Header) (Backend, string, error) { return b, "req-1", nil }}).Handlers()
	connect := func(h http.Handler) *mcp.ClientSession {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return connectHTTP(t, srv.URL)
	}
	return fake, connect(code), connect(noCode)
}

func toolsOf(t *testing.T, cs *mcp.ClientSession) map[string]*mcp.Tool {
	t.Helper()
	list, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*mcp.Tool{}
	for _, tool := range list.Tools {
		m[tool.Name] = tool
	}
	return m
}

func callAPI(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) (*mcp.CallToolResult, string) {
	t.Helper()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error %v", name, err)
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return res, b.String()
}

// TestAPIToolsListed checks that the endpoint without code execution
// offers the declared tools with their schemas and true annotations, and
// that execute_code tells code where the same API is.
func TestAPIToolsListed(t *testing.T) {
	t.Parallel()
	_, withCode, withoutCode := apiServers(t)
	got := toolsOf(t, withoutCode)
	var names []string
	for n := range got {
		names = append(names, n)
	}
	slices.Sort(names)
	if want := append(slices.Clone(githubTools), "list_languages"); !slices.Equal(names, want) {
		t.Fatalf("tools %v, want %v", names, want)
	}
	for _, n := range githubTools {
		tool := got[n]
		a := tool.Annotations
		if a == nil || !a.ReadOnlyHint || !a.IdempotentHint || a.OpenWorldHint == nil || !*a.OpenWorldHint {
			t.Errorf("%s annotations %+v: want read-only, idempotent, open world", n, a)
		}
		schema, _ := json.Marshal(tool.InputSchema)
		if !strings.Contains(string(schema), `"required":["username"]`) || tool.Description == "" {
			t.Errorf("%s: schema %s, description %q", n, schema, tool.Description)
		}
	}

	code := toolsOf(t, withCode)
	for _, n := range githubTools {
		if code[n] != nil {
			t.Errorf("/mcp offers %s", n)
		}
	}
	if d := code["execute_code"].Description; !strings.Contains(d, "http://github.api.codemode/ for http://127.0.0.1:") {
		t.Errorf("execute_code's description does not name the API's host for code: %s", d)
	}
}

// TestAPIToolCalls calls each GitHub tool as a model would and checks the
// fake's data comes back, as text and structured content; that the fake
// got the token; and that no result holds it.
func TestAPIToolCalls(t *testing.T) {
	t.Parallel()
	fake, _, cs := apiServers(t, directtools.WithMaxResponseBytes(32<<10))
	for _, tc := range []struct {
		tool, wantText string
		args           map[string]any
		check          func(body any) bool
	}{
		{"github_list_user_repos", `"full_name": "octocat/Hello-World"`, map[string]any{"username": "octocat"},
			func(b any) bool { l, _ := b.([]any); return len(l) == 2 }},
		{"github_list_user_pull_requests", `"title": "Add a widget cache"`, map[string]any{"username": "octocat", "per_page": 10},
			func(b any) bool { m, _ := b.(map[string]any); return m["total_count"] == float64(3) }},
		{"github_list_user_closed_pull_requests", `"title": "Fix the gear ratio"`, map[string]any{"username": "octocat"},
			func(b any) bool { m, _ := b.(map[string]any); return m["total_count"] == float64(1) }},
		{"github_list_user_issues", `"title": "Widgets spin backwards"`, map[string]any{"username": "octocat"},
			func(b any) bool { m, _ := b.(map[string]any); return m["total_count"] == float64(2) }},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			res, text := callAPI(t, cs, tc.tool, tc.args)
			if res.IsError || !strings.Contains(text, tc.wantText) {
				t.Fatalf("isError=%v %.300s", res.IsError, text)
			}
			sc, _ := res.StructuredContent.(map[string]any)
			if sc["status"] != float64(200) || !tc.check(sc["body"]) {
				t.Errorf("structured content %.300v", res.StructuredContent)
			}
			raw, _ := json.Marshal(res)
			if strings.Contains(string(raw), githubToken) {
				t.Errorf("the result holds the token")
			}
		})
	}
	qs := map[string]bool{}
	for _, r := range fake.Requests() {
		if r.Header.Get("Authorization") != "Bearer "+githubToken {
			t.Errorf("%s %s came without the token", r.Method, r.Path)
		}
		qs[r.Query.Get("q")] = true
	}
	for _, q := range []string{"type:pr author:octocat", "type:pr author:octocat is:closed", "type:issue author:octocat"} {
		if !qs[q] {
			t.Errorf("no search for %q reached the API (searches: %v)", q, qs)
		}
	}

	t.Run("echoed token is redacted", func(t *testing.T) {
		res, text := callAPI(t, cs, "github_list_user_repos", map[string]any{"username": "echo"})
		raw, _ := json.Marshal(res)
		if res.IsError || strings.Contains(string(raw), githubToken) || !strings.Contains(text, "you sent: Bearer [REDACTED]") {
			t.Fatalf("isError=%v %.300s", res.IsError, text)
		}
	})
	t.Run("error status is isError", func(t *testing.T) {
		res, text := callAPI(t, cs, "github_list_user_repos", map[string]any{"username": "ghost"})
		// The API's name and the path below its base URL; never the
		// base URL.
		if !res.IsError || !strings.Contains(text, "github answered 404 Not Found to GET /users/ghost/repos") || !strings.Contains(text, `"message":"Not Found"`) ||
			strings.Contains(text, fake.URL) || strings.Contains(text, strings.TrimPrefix(fake.URL, "http://")) {
			t.Fatalf("isError=%v %q", res.IsError, text)
		}
	})
	t.Run("bad arguments are isError", func(t *testing.T) {
		for _, args := range []map[string]any{{}, {"username": "a/b"}, {"username": "octocat", "per_page": 500}, {"username": "octocat", "extra": 1}} {
			res, text := callAPI(t, cs, "github_list_user_repos", args)
			if !res.IsError || !strings.Contains(text, "invalid_argument: invalid arguments for github_list_user_repos") {
				t.Errorf("%v: isError=%v %q", args, res.IsError, text)
			}
		}
	})
	t.Run("large answer is cut, saying so", func(t *testing.T) {
		res, text := callAPI(t, cs, "github_list_user_repos", map[string]any{"username": "many", "per_page": 100})
		sc, _ := res.StructuredContent.(map[string]any)
		if res.IsError || sc["truncated"] != true || sc["body"] != nil || !strings.Contains(text, "[the answer was cut at 32768 bytes") {
			t.Fatalf("isError=%v structured %.200v ...%q", res.IsError, sc, text[max(0, len(text)-200):])
		}
	})
}

// TestAPIToolLimits checks that API calls count against the tenant's
// admission limits, as runs do.
func TestAPIToolLimits(t *testing.T) {
	t.Parallel()
	_, _, cs := apiServers(t, directtools.WithAdmission(ratelimit.New(ratelimit.Config{Rate: 0.001, Burst: 1})))
	if res, text := callAPI(t, cs, "github_list_user_repos", map[string]any{"username": "octocat"}); res.IsError {
		t.Fatalf("first call: %s", text)
	}
	res, text := callAPI(t, cs, "github_list_user_repos", map[string]any{"username": "octocat"})
	if !res.IsError || !strings.Contains(text, "resource_exhausted") || !strings.Contains(text, "request id req-1") {
		t.Fatalf("second call: isError=%v %q", res.IsError, text)
	}
}

// TestDescriptionsSayTheNetwork checks that execute_code's description
// says there is no network when no egress is configured, and names a
// declared API for code only when some tenant's egress allows its host.
func TestDescriptionsSayTheNetwork(t *testing.T) {
	t.Parallel()
	catalog, err := apicatalog.Parse(apicatalog.DefaultDeclaration(), apicatalog.WithBaseURL("github", "http://127.0.0.1:9"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, egress      string
		network, api, not []string
	}{
		{name: "no egress", network: []string{"There is no network"}, not: []string{"github.api.codemode", "egress rules"}},
		{name: "egress without the API", egress: `{"tenants": {"t": {"allow": [{"host": "pypi.org"}]}}}`,
			network: []string{"closed except for the hosts this deployment's egress rules allow"}, not: []string{"github.api.codemode", "There is no network"}},
		{name: "egress to the API", egress: `{"default": {"allow": [{"host": "*.api.codemode"}]}}`,
			network: []string{"closed except"}, api: []string{"http://github.api.codemode/ for http://127.0.0.1:9"}, not: []string{"There is no network"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var egress *tenant.EgressConfig
			if tc.egress != "" {
				var err error
				if egress, err = tenant.ParseEgress([]byte(tc.egress)); err != nil {
					t.Fatal(err)
				}
			}
			cs, _ := connectScripted(t, &scripted{}, Config{APIs: catalog, Egress: egress})
			d := toolsOf(t, cs)["execute_code"].Description
			for _, w := range append(tc.network, tc.api...) {
				if !strings.Contains(d, w) {
					t.Errorf("description lacks %q: %s", w, d)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(d, w) {
					t.Errorf("description says %q: %s", w, d)
				}
			}
		})
	}
}

// TestEveryToolHasAnOutputSchema checks both tool sets.
func TestEveryToolHasAnOutputSchema(t *testing.T) {
	t.Parallel()
	_, withCode, withoutCode := apiServers(t)
	for name, cs := range map[string]*mcp.ClientSession{"with code": withCode, "without code": withoutCode} {
		for n, tool := range toolsOf(t, cs) {
			if tool.OutputSchema == nil {
				t.Errorf("%s: %s has no output schema", name, n)
			}
		}
	}
}
