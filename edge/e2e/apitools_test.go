package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	"github.com/codemode-go/codemode/internal/apicatalog"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/apistest"
)

// keySession connects an MCP client to endpoint as the tenant of key.
func keySession(t *testing.T, endpoint, key string) *mcp.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: bearer{key: key, next: http.DefaultTransport}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-apis", Version: "1"}, nil).
		Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connect MCP %s: %v", endpoint, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestAPITools starts an edge whose API declaration is the shipped GitHub
// one pointed at a fake GitHub on loopback, with a token in a file, API
// keys for alice and mallory, and the tenantblock policy denying mallory.
// A real MCP client lists and calls every GitHub tool on
// /mcp-no-code-execute and gets the fake's data; the fake sees the token,
// which no result and no log line holds; mallory's call is denied before it
// reaches the fake; bad arguments and an error status are tool errors.
func TestAPITools(t *testing.T) {
	t.Parallel()
	s := shared(t)
	fake := apistest.NewGitHub(t)
	edge := startAPIToolsEdge(t, s, fake.URL)
	noCode := edge.URL() + "/mcp-no-code-execute"
	alice := keySession(t, noCode, apisKeyAlice)
	checkGitHubTools(t, alice, fake)

	ac := &apiToolsCase{edge: edge, fake: fake, noCode: noCode, alice: alice}
	t.Run("the token is redacted from an echo", ac.tokenRedactedFromEcho)
	t.Run("error status", ac.errorStatus)
	t.Run("bad arguments", ac.badArguments)
	t.Run("a policy denial stops the call", ac.policyDenial)
	t.Run("no key", ac.noKey)
	t.Run("a policy denial stops the call on /no-code/mcp too", ac.policyDenialOnNoCodeToo)
	t.Run("execute_code names the API for code", ac.executeCodeNamesTheAPI)
	if logs := edge.Logs(); strings.Contains(logs, apisToken) {
		t.Error("the edge logged the token")
	} else if !strings.Contains(logs, `"msg":"api call"`) {
		t.Errorf("the edge logged no API call:\n%s", logs)
	}
}

// The GitHub token and the API keys of TestAPITools' edge.
const (
	apisToken                    = "ghp_e2e0123456789abcdefghijklmnopqrstu"
	apisKeyAlice, apisKeyMallory = "k-apis-alice-0123456789", "k-apis-mallory-0123456789"
)

// startAPIToolsEdge starts an edge of s whose API declaration is the
// shipped GitHub one pointed at fakeURL, with apisToken in a file, the API
// keys of alice and mallory, the tenantblock policy denying mallory, and
// egress to the API for every tenant; extra are more flags.
func startAPIToolsEdge(t *testing.T, s *Stack, fakeURL string, extra ...string) *Process {
	t.Helper()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "github-token")
	if err := os.WriteFile(tokenFile, []byte(apisToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// The shipped declaration, pointed at the fake, its apisToken read from a
	// file and required.
	var decl apicatalog.Declaration
	if err := json.Unmarshal(apicatalog.DefaultDeclaration(), &decl); err != nil {
		t.Fatal(err)
	}
	decl.APIs[0].BaseURL = fakeURL
	decl.APIs[0].Credential = &apicatalog.Credential{Header: "Authorization", Prefix: "Bearer ", SecretFile: tokenFile}
	declFile := filepath.Join(dir, "apicatalog.json")
	writeJSON(t, declFile, decl)

	mods, err := policytest.BuildInto(dir, "tenantblock")
	if err != nil {
		t.Fatal(err)
	}
	block := mods.Path(t, "tenantblock")
	policies := filepath.Join(dir, "policies.json")
	writeJSON(t, policies, map[string]any{"policies": []map[string]any{{
		"name": "tenantblock", "path": filepath.Base(block), "sha256": policytest.Digest(t, block), "phase": "request", "config": "mallory",
	}}})
	keys := filepath.Join(dir, "keys.json")
	writeJSON(t, keys, map[string]string{apisKeyAlice: "alice", apisKeyMallory: "mallory"})

	// Code reaches a declared API only where its tenant's egress allows:
	// execute_code's description names the API only then.
	egress := filepath.Join(dir, "egress.json")
	writeJSON(t, egress, map[string]any{"default": map[string]any{"allow": []map[string]any{{"host": "github.api.codemode"}}}})

	edge, err := s.StartEdge(nil, append([]string{"--apis", declFile, "--api-keys", keys, "--policy-config", policies, "--egress", egress}, extra...)...)
	if err != nil {
		t.Fatalf("start edge: %v", err)
	}
	t.Cleanup(func() { _ = edge.Stop(30 * time.Second) })
	return edge
}

// checkGitHubTools lists the tools alice sees and calls each GitHub one:
// each answers the fake's data, and the fake saw the token on each call.
func checkGitHubTools(t *testing.T, alice *mcp.ClientSession, fake *apistest.GitHub) {
	t.Helper()
	list, err := alice.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range list.Tools {
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	want := []string{"github_list_user_closed_pull_requests", "github_list_user_issues", "github_list_user_pull_requests", "github_list_user_repos", "list_languages"}
	if !slices.Equal(names, want) {
		t.Fatalf("tools on /mcp-no-code-execute: %v, want %v", names, want)
	}

	for _, tc := range []struct {
		tool, want string
		args       map[string]any
	}{
		{"github_list_user_repos", `"full_name": "octocat/Hello-World"`, map[string]any{"username": "octocat", "per_page": 5}},
		{"github_list_user_pull_requests", `"title": "Add a widget cache"`, map[string]any{"username": "octocat"}},
		{"github_list_user_closed_pull_requests", `"title": "Fix the gear ratio"`, map[string]any{"username": "octocat"}},
		{"github_list_user_issues", `"title": "Widgets spin backwards"`, map[string]any{"username": "octocat"}},
	} {
		res := call(t, alice, tc.tool, tc.args)
		if res.IsError || !strings.Contains(testkit.ToolText(res), tc.want) {
			t.Errorf("%s: isError=%v %.300s", tc.tool, res.IsError, testkit.ToolText(res))
		}
		if sc := structured(t, res); sc["status"] != float64(200) || sc["body"] == nil {
			t.Errorf("%s: structured content %.300v", tc.tool, sc)
		}
	}
	reqs := fake.Requests()
	if len(reqs) != 4 {
		t.Fatalf("the fake got %d requests, want 4", len(reqs))
	}
	for _, r := range reqs {
		if r.Header.Get("Authorization") != "Bearer "+apisToken || r.Header.Get("X-GitHub-Api-Version") != "2022-11-28" {
			t.Errorf("%s %s came with headers %v", r.Method, r.Path, r.Header)
		}
	}
	if q := reqs[0].Query; reqs[0].Path != "/users/octocat/repos" || q.Get("per_page") != "5" || q.Get("sort") != "updated" || q.Get("type") != "owner" || q.Has("page") {
		t.Errorf("repos request %s %v", reqs[0].Path, q)
	}

}

// apiToolsCase is TestAPITools' edge, fake GitHub and alice's session on
// the door without code execution.
type apiToolsCase struct {
	edge   *Process
	fake   *apistest.GitHub
	noCode string // the door's URL
	alice  *mcp.ClientSession
}

func (ac *apiToolsCase) tokenRedactedFromEcho(t *testing.T) {
	res := call(t, ac.alice, "github_list_user_repos", map[string]any{"username": "echo"})
	if res.IsError || strings.Contains(testkit.ToolText(res), apisToken) || !strings.Contains(testkit.ToolText(res), "Bearer [REDACTED]") {
		t.Fatalf("isError=%v %.300s", res.IsError, testkit.ToolText(res))
	}
}

func (ac *apiToolsCase) errorStatus(t *testing.T) {
	res := call(t, ac.alice, "github_list_user_repos", map[string]any{"username": "ghost"})
	if !res.IsError || !strings.Contains(testkit.ToolText(res), "github answered 404 Not Found to GET /users/ghost/repos") || strings.Contains(testkit.ToolText(res), strings.TrimPrefix(ac.fake.URL, "http://")) {
		t.Fatalf("isError=%v %q", res.IsError, testkit.ToolText(res))
	}
}

func (ac *apiToolsCase) badArguments(t *testing.T) {
	before := len(ac.fake.Requests())
	res := call(t, ac.alice, "github_list_user_issues", map[string]any{"username": "octocat author:someone-else"})
	if !res.IsError || !strings.Contains(testkit.ToolText(res), "invalid_argument: invalid arguments for github_list_user_issues") || !strings.Contains(testkit.ToolText(res), "username") {
		t.Fatalf("isError=%v %q", res.IsError, testkit.ToolText(res))
	}
	if len(ac.fake.Requests()) != before {
		t.Error("a call with bad arguments reached the API")
	}
}

func (ac *apiToolsCase) policyDenial(t *testing.T) {
	before := len(ac.fake.Requests())
	mallory := keySession(t, ac.noCode, apisKeyMallory)
	res := call(t, mallory, "github_list_user_repos", map[string]any{"username": "octocat"})
	if !res.IsError || !strings.Contains(testkit.ToolText(res), "permission_denied: denied by policy tenantblock: tenant is suspended by the tenant policy") {
		t.Fatalf("mallory: isError=%v %q", res.IsError, testkit.ToolText(res))
	}
	if len(ac.fake.Requests()) != before {
		t.Error("mallory's denied call reached the API")
	}
}

func (ac *apiToolsCase) noKey(t *testing.T) {
	for _, endpoint := range []string{ac.noCode, ac.edge.URL() + "/no-code/mcp"} {
		client := mcp.NewClient(&mcp.Implementation{Name: "e2e-apis", Version: "1"}, nil)
		if _, err := client.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: endpoint}, nil); err == nil {
			t.Fatalf("connected to %s without a key", endpoint)
		}
	}
}

func (ac *apiToolsCase) policyDenialOnNoCodeToo(t *testing.T) {
	before := len(ac.fake.Requests())
	res := call(t, keySession(t, ac.edge.URL()+"/no-code/mcp", apisKeyMallory), "github_list_user_repos", map[string]any{"username": "octocat"})
	if !res.IsError || !strings.Contains(testkit.ToolText(res), "denied by policy tenantblock") || len(ac.fake.Requests()) != before {
		t.Fatalf("mallory on /no-code/mcp: isError=%v %q", res.IsError, testkit.ToolText(res))
	}
}

func (ac *apiToolsCase) executeCodeNamesTheAPI(t *testing.T) {
	tools, err := keySession(t, ac.edge.URL()+"/mcp", apisKeyAlice).ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if strings.HasPrefix(tool.Name, "github_") {
			t.Errorf("/mcp offers %s", tool.Name)
		}
		if tool.Name == "execute_code" && !strings.Contains(tool.Description, "http://github.api.codemode/ for "+ac.fake.URL) {
			t.Errorf("execute_code's description: %s", tool.Description)
		}
	}
}

// echoToken is the credential of the echo APIs: it has the characters
// encoders escape ('/', '+').
const echoToken = "ghp_e2e/echo+0123456789abcdefghijklmnopq"

// echoDeclaration declares two APIs on an apistest.Echo, their credential
// echoToken read from a file: "echo", whose answers are redacted, and
// "strict", declared with refuse_echo; each with the tool NAME_form whose
// argument form is the path.
func echoDeclaration(t *testing.T, dir, baseURL string) apicatalog.Declaration {
	t.Helper()
	tokenFile := filepath.Join(dir, "echo-token")
	if err := os.WriteFile(tokenFile, []byte(echoToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var d apicatalog.Declaration
	for _, name := range []string{"echo", "strict"} {
		d.APIs = append(d.APIs, apicatalog.APIDeclaration{
			Name: name, Description: "echoes its credential", BaseURL: baseURL,
			Credential: &apicatalog.Credential{Header: "Authorization", Prefix: "Bearer ", SecretFile: tokenFile, RefuseEcho: name == "strict"},
			Tools: []apicatalog.ToolDeclaration{{Name: name + "_form", Description: "Echo the credential in a form.", Path: "/{form}",
				Parameters: json.RawMessage(`{"type": "object", "properties": {"form": {"type": "string"}}, "required": ["form"]}`)}},
		})
	}
	return d
}

// TestAPIToolsEchoedCredential calls, through the edge's MCP door
// /mcp-no-code-execute, an API on loopback that echoes its credential in
// every form apistest.Echo writes (gzip, JSON escapes, percent-encoding,
// base64, ranges, trailers, Location, the reason phrase, an early hint),
// and checks that the caller gets no form of it, in the text or in the
// structured content once decoded; that an API declared with refuse_echo
// gives a tool error instead; and that errors name the API, not its
// address.
func TestAPIToolsEchoedCredential(t *testing.T) {
	t.Parallel()
	s := shared(t)
	echo := apistest.NewEcho(t, "Authorization")
	dir := t.TempDir()
	declFile := filepath.Join(dir, "apicatalog.json")
	writeJSON(t, declFile, echoDeclaration(t, dir, echo.URL))
	const key = "k-apis-echo-0123456789"
	keys := filepath.Join(dir, "keys.json")
	writeJSON(t, keys, map[string]string{key: "echoer"})
	edge, err := s.StartEdge(nil, "--apis", declFile, "--api-keys", keys)
	if err != nil {
		t.Fatalf("start edge: %v", err)
	}
	t.Cleanup(func() { _ = edge.Stop(30 * time.Second) })
	cs := keySession(t, edge.URL()+"/mcp-no-code-execute", key)
	find := apicatalog.NewRedactor([]byte(echoToken), false)
	for _, form := range apistest.EchoForms {
		t.Run(form, func(t *testing.T) {
			res := call(t, cs, "echo_form", map[string]any{"form": form})
			raw, _ := json.Marshal(res)
			seen := testkit.ToolText(res) + "\n" + string(raw)
			if res.StructuredContent != nil {
				// As a client reads it: JSON decoded, escapes gone.
				seen += fmt.Sprint(structured(t, res))
			}
			if res.IsError != (form == "reason") || find.Found([]byte(seen)) || strings.Contains(seen, "0123456789abcdefghijklmnopq") {
				t.Errorf("isError=%v, the caller got the token: %s", res.IsError, seen)
			}
			res = call(t, cs, "strict_form", map[string]any{"form": form})
			switch form {
			case "trailer", "early": // dropped: nothing left to refuse
			default:
				if !res.IsError || !strings.Contains(testkit.ToolText(res), "permission_denied: the answer of strict echoes its credential and is withheld") {
					t.Errorf("strict: isError=%v %q", res.IsError, testkit.ToolText(res))
				}
			}
		})
	}
	t.Run("errors name the API, not its address", func(t *testing.T) {
		res := call(t, cs, "echo_form", map[string]any{"form": "nowhere"})
		if !res.IsError || !strings.Contains(testkit.ToolText(res), "echo answered 404 Not Found to GET /nowhere") || strings.Contains(testkit.ToolText(res), strings.TrimPrefix(echo.URL, "http://")) {
			t.Errorf("isError=%v %q", res.IsError, testkit.ToolText(res))
		}
	})
	if logs := edge.Logs(); strings.Contains(logs, echoToken) {
		t.Error("the edge logged the token")
	}
}

// TestAPIsFlag checks the edge's --apis: a declaration that does not load
// stops the edge with the reason, and "none" offers no API tools.
func TestAPIsFlag(t *testing.T) {
	t.Parallel()
	s := shared(t)
	bad := filepath.Join(t.TempDir(), "apicatalog.json")
	if err := os.WriteFile(bad, []byte(`{"apis": [{"name": "Bad Name", "base_url": "http://127.0.0.1:1"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err := s.StartEdge(nil, "--apis", bad); err == nil {
		_ = p.Stop(30 * time.Second)
		t.Fatal("an edge started with a bad API declaration")
	} else if !strings.Contains(err.Error(), `api "Bad Name": the name must match`) {
		t.Errorf("the edge did not say what is wrong: %v", err)
	}

	edge, err := s.StartEdge([]string{"CODEMODE_APIS=none"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = edge.Stop(30 * time.Second) })
	if names := listTools(t, edge.URL()+"/mcp-no-code-execute"); fmt.Sprint(names) != "[list_languages]" {
		t.Errorf("tools with CODEMODE_APIS=none: %v", names)
	}
}

func writeJSON(t testing.TB, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
