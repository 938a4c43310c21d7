package directtools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/edge/internal/policy"
	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	"github.com/codemode-go/codemode/edge/internal/ratelimit"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"github.com/codemode-go/codemode/internal/apicatalog"
	"github.com/codemode-go/codemode/internal/testkit/apistest"
)

const token = "ghp_test0123456789abcdefghijklmnopqrstuv"

// github returns the shipped declaration pointed at a fake GitHub, with
// token as its credential.
func github(t *testing.T) (*apistest.GitHub, *apicatalog.Catalog) {
	t.Helper()
	fake := apistest.NewGitHub(t)
	c, err := apicatalog.Parse(apicatalog.DefaultDeclaration(), apicatalog.WithBaseURL("github", fake.URL),
		apicatalog.WithGetenv(func(k string) string {
			if k == "CODEMODE_GITHUB_TOKEN" {
				return token
			}
			return ""
		}))
	if err != nil {
		t.Fatal(err)
	}
	return fake, c
}

func tool(t *testing.T, c *apicatalog.Catalog, name string) *apicatalog.Tool {
	t.Helper()
	tl, ok := c.Tool(name)
	if !ok {
		t.Fatalf("no tool %s", name)
	}
	return tl
}

func TestCall(t *testing.T) {
	t.Parallel()
	fake, c := github(t)
	s := New(nil)
	res, err := s.Call(t.Context(), Call{Tool: tool(t, c, "github_list_user_repos"), Arguments: []byte(`{"username": "octocat", "per_page": 5}`), Tenant: "t", RequestID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	var repos []map[string]any
	if err := json.Unmarshal(res.Body, &repos); err != nil || len(repos) != 2 || repos[0]["full_name"] != "octocat/Hello-World" {
		t.Fatalf("body %s: %v", res.Body, err)
	}
	if res.Status != 200 || res.Truncated || res.Method != "GET" || res.URL != fake.URL+"/users/octocat/repos?per_page=5&sort=updated&type=owner" {
		t.Errorf("response %+v", res)
	}
	reqs := fake.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	h := reqs[0].Header
	if h.Get("Authorization") != "Bearer "+token || h.Get("Accept") != "application/vnd.github+json" || h.Get("X-GitHub-Api-Version") != "2022-11-28" {
		t.Errorf("headers sent: %v", h)
	}
}

func TestCallErrors(t *testing.T) {
	t.Parallel()
	_, c := github(t)
	repos := tool(t, c, "github_list_user_repos")

	t.Run("bad arguments", func(t *testing.T) {
		t.Parallel()
		_, err := New(nil).Call(t.Context(), Call{Tool: repos, Arguments: []byte(`{"username": "a/b"}`)})
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "username") {
			t.Fatalf("err = %v, want invalid_argument about username", err)
		}
	})
	t.Run("error status is a response", func(t *testing.T) {
		t.Parallel()
		res, err := New(nil).Call(t.Context(), Call{Tool: repos, Arguments: []byte(`{"username": "ghost"}`)})
		if err != nil || res.Status != 404 || res.StatusText != "404 Not Found" || !strings.Contains(string(res.Body), "Not Found") {
			t.Fatalf("%+v %v", res, err)
		}
	})
	t.Run("echoed secret is redacted", func(t *testing.T) {
		t.Parallel()
		res, err := New(nil).Call(t.Context(), Call{Tool: repos, Arguments: []byte(`{"username": "echo"}`)})
		if err != nil || strings.Contains(string(res.Body), token) || !strings.Contains(string(res.Body), "Bearer "+apicatalog.Redacted) {
			t.Fatalf("%s %v", res.Body, err)
		}
	})
	t.Run("large answer is cut", func(t *testing.T) {
		t.Parallel()
		res, err := New(nil, WithMaxResponseBytes(10_000)).Call(t.Context(), Call{Tool: repos, Arguments: []byte(`{"username": "many", "per_page": 100}`)})
		if err != nil || !res.Truncated || len(res.Body) != 10_000 {
			t.Fatalf("truncated %v, %d bytes, %v", res.Truncated, len(res.Body), err)
		}
	})
	t.Run("tenant limits", func(t *testing.T) {
		t.Parallel()
		s := New(nil, WithAdmission(ratelimit.New(ratelimit.Config{Rate: 0.001, Burst: 1})))
		call := Call{Tool: repos, Arguments: []byte(`{"username": "octocat"}`), Tenant: "t"}
		if _, err := s.Call(t.Context(), call); err != nil {
			t.Fatal(err)
		}
		_, err := s.Call(t.Context(), call)
		var ce *connect.Error
		if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "rate limit") ||
			!errors.As(err, &ce) || ce.Meta().Get("Retry-After") == "" {
			t.Fatalf("second call: %v, want resource_exhausted with a retry hint", err)
		}
		if _, err := s.Call(t.Context(), Call{Tool: repos, Arguments: call.Arguments, Tenant: "other"}); err != nil {
			t.Fatalf("another tenant: %v", err)
		}
	})
}

// TestTransport checks what happens when no usable answer comes: a slow
// API, one that is not listening, and redirects.
func TestTransport(t *testing.T) {
	t.Parallel()
	decl := func(base string) *apicatalog.Tool {
		c, err := apicatalog.Parse([]byte(`{"apis": [{"name": "ex", "base_url": "`+base+`",
			"credential": {"header": "X-Key", "secret_env": "K"},
			"tools": [{"name": "ex_get", "description": "d", "path": "/{p}", "parameters": {"type": "object", "properties": {"p": {"type": "string"}}, "required": ["p"]}}]}]}`),
			apicatalog.WithGetenv(func(string) string { return "key-0123456789" }))
		if err != nil {
			t.Fatal(err)
		}
		tl, _ := c.Tool("ex_get")
		return tl
	}
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a redirect off the API's host was followed, carrying X-Key %q", r.Header.Get("X-Key"))
	}))
	t.Cleanup(elsewhere.Close)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			<-r.Context().Done()
		case "/moved":
			http.Redirect(w, r, "/here", http.StatusMovedPermanently)
		case "/here":
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte("arrived with " + r.Header.Get("X-Key")))
		case "/away":
			http.Redirect(w, r, elsewhere.URL+"/x", http.StatusFound)
		}
	}))
	t.Cleanup(api.Close)
	get := decl(api.URL)

	t.Run("timeout", func(t *testing.T) {
		t.Parallel()
		_, err := New(nil, WithTimeout(200*time.Millisecond)).Call(t.Context(), Call{Tool: get, Arguments: []byte(`{"p": "slow"}`)})
		if connect.CodeOf(err) != connect.CodeDeadlineExceeded || !strings.Contains(err.Error(), "ex did not answer within 200ms") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("same-host redirect is followed, credential redacted", func(t *testing.T) {
		t.Parallel()
		res, err := New(nil).Call(t.Context(), Call{Tool: get, Arguments: []byte(`{"p": "moved"}`)})
		if err != nil || res.Status != 200 || string(res.Body) != "arrived with "+apicatalog.Redacted {
			t.Fatalf("%+v %v", res, err)
		}
	})
	t.Run("redirect to another host is not followed", func(t *testing.T) {
		t.Parallel()
		res, err := New(nil).Call(t.Context(), Call{Tool: get, Arguments: []byte(`{"p": "away"}`)})
		if err != nil || res.Status != http.StatusFound || res.Location != elsewhere.URL+"/x" {
			t.Fatalf("%+v %v", res, err)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close() // nothing listens there now
		_, err = New(nil).Call(t.Context(), Call{Tool: decl("http://" + addr), Arguments: []byte(`{"p": "x"}`), RequestID: "r9"})
		if connect.CodeOf(err) != connect.CodeUnavailable || strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "ex could not be reached (request id r9)") {
			t.Fatalf("err = %v, want unavailable naming the API, not its address", err)
		}
	})
}

// TestCutKeepsSecretRedacted checks that a secret that straddles the cut is
// still redacted whole.
func TestCutKeepsSecretRedacted(t *testing.T) {
	t.Parallel()
	c, err := apicatalog.Parse([]byte(`{"apis": [{"name": "ex", "base_url": "http://127.0.0.1:9", "credential": {"header": "X-Key", "secret_env": "K"}}]}`),
		apicatalog.WithGetenv(func(string) string { return "SECRET-0123456789" }))
	if err != nil {
		t.Fatal(err)
	}
	api, _ := c.Lookup("ex")
	h, _ := api.Header(t.Context())
	redacted := func(s string) io.Reader { return api.Redactor(h).Reader(io.NopCloser(strings.NewReader(s))) }
	body := strings.Repeat("x", 95) + "SECRET-0123456789" + strings.Repeat("y", 100)
	b, truncated, err := New(nil, WithMaxResponseBytes(100)).read(redacted(body))
	if err != nil || !truncated || strings.Contains(string(b), "SECRET") || string(b) != strings.Repeat("x", 95) {
		t.Fatalf("%q %v %v", b, truncated, err)
	}
	// Many echoes shorten the body below the limit when redacted, though
	// more was there to read.
	b, truncated, err = New(nil, WithMaxResponseBytes(100)).read(redacted(strings.Repeat("SECRET-0123456789", 20)))
	if err != nil || !truncated || strings.Contains(string(b), "SECRET") {
		t.Fatalf("%q %v %v", b, truncated, err)
	}
	b, _, _ = New(nil, WithMaxResponseBytes(100)).read(redacted(strings.Repeat("x", 99) + "é"))
	if string(b) != strings.Repeat("x", 99) {
		t.Errorf("cut in a character: %q", b)
	}
}

// TestPolicies checks that the request-phase policies see the call, with
// door mcp-api and api_call, and that a denial stops it before it is sent.
func TestPolicies(t *testing.T) {
	t.Parallel()
	fake, c := github(t)
	engine := apiguard(t, "github_list_user_issues")
	s := New(nil, WithPolicies(engine))

	if _, err := s.Call(t.Context(), Call{Tool: tool(t, c, "github_list_user_pull_requests"), Arguments: []byte(`{"username": "octocat"}`), Tenant: "acme", RequestID: "r1"}); err != nil {
		t.Fatalf("an allowed call: %v", err)
	}
	_, err := s.Call(t.Context(), Call{Tool: tool(t, c, "github_list_user_issues"), Arguments: []byte(`{"username": "octocat"}`), Tenant: "acme", RequestID: "r2"})
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodePermissionDenied {
		t.Fatalf("err = %v, want permission_denied", err)
	}
	want := `github_list_user_issues is off for acme at door mcp-api: GET ` + fake.URL + `/search/issues?q=type%3Aissue+author%3Aoctocat {"username":"octocat"} on github`
	var denial *policyv1.Denial
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			denial, _ = v.(*policyv1.Denial)
		}
	}
	if denial.GetPolicy() != "apiguard" || denial.GetReason() != want || denial.GetRequestId() != "r2" {
		t.Fatalf("denial %v, want reason %q", denial, want)
	}
	if err.Error() != "permission_denied: denied by policy apiguard: "+want {
		t.Errorf("message %q", err.Error())
	}
	for _, r := range fake.Requests() {
		if strings.Contains(r.Query.Get("q"), "type:issue") {
			t.Errorf("the denied call reached the API: %v", r)
		}
	}
}

// apiguard loads the test policy testdata/apiguard, denying the tool named
// blocked.
func apiguard(t *testing.T, blocked string) *policy.Engine {
	t.Helper()
	dir := t.TempDir()
	wasm := filepath.Join(dir, "apiguard.wasm")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", wasm, "./testdata/apiguard")
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the test policy: %v\n%s", err, out)
	}
	b, err := os.ReadFile(wasm)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	cfg, _ := json.Marshal(policy.Config{Deadline: policy.Duration(2 * time.Second), Policies: []policy.PolicyConfig{{
		Name: "apiguard", Path: "apiguard.wasm", SHA256: hex.EncodeToString(sum[:]), Phase: policy.PhaseRequest, Config: blocked, PoolSize: 1,
	}}})
	path := filepath.Join(dir, "policies.json")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	e, err := policy.New(context.Background(), policy.Options{ConfigPath: path, CacheDir: policytest.CacheDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}

// echoToken has the characters encoders escape ('/', '+').
const echoToken = "ghp_echo/0123+456789abcdefghijklmnopqrst"

// echoTool returns the tool ex_echo of an API on an apistest.Echo, whose
// credential is echoToken, refusing echoes if refuse.
func echoTool(t *testing.T, refuse bool) *apicatalog.Tool {
	t.Helper()
	echo := apistest.NewEcho(t, "Authorization")
	c, err := apicatalog.Parse([]byte(`{"apis": [{"name": "ex", "base_url": "`+echo.URL+`/base",
		"credential": {"header": "Authorization", "prefix": "Bearer ", "secret_env": "K", "refuse_echo": `+fmt.Sprint(refuse)+`},
		"tools": [{"name": "ex_echo", "description": "d", "path": "/{form}", "parameters": {"type": "object", "properties": {"form": {"type": "string"}}, "required": ["form"]}}]}]}`),
		apicatalog.WithGetenv(func(string) string { return echoToken }))
	if err != nil {
		t.Fatal(err)
	}
	return tool(t, c, "ex_echo")
}

// TestEchoedCredential calls an API that echoes its credential in every
// form apistest.Echo writes, and checks that no form of it reaches the
// caller: not in the body (nor the body decoded as JSON, as structured
// content is), the reason phrase or Location; and that an API declared
// with refuse_echo gets an error instead.
func TestEchoedCredential(t *testing.T) {
	t.Parallel()
	get := echoTool(t, false)
	refusing := echoTool(t, true)
	find := apicatalog.NewRedactor([]byte(echoToken), false)
	for _, form := range apistest.EchoForms {
		t.Run(form, func(t *testing.T) {
			t.Parallel()
			res, err := New(nil).Call(t.Context(), Call{Tool: get, Arguments: []byte(`{"form": "` + form + `"}`)})
			if err != nil {
				t.Fatal(err)
			}
			all, _ := json.Marshal(res) // the body as base64
			all = append(all, res.Body...)
			var decoded any
			if json.Unmarshal(res.Body, &decoded) == nil {
				b, _ := json.Marshal(decoded)
				all = append(all, b...)
			}
			if find.Found(all) || strings.Contains(string(all), echoToken) || strings.Contains(string(all), strings.Split(echoToken, "/")[1]) {
				t.Fatalf("the answer holds the token: %s", all)
			}
			if !strings.Contains(string(all), apicatalog.Redacted) && form != "trailer" && form != "early" {
				t.Errorf("nothing redacted: %s", all)
			}

			_, err = New(nil).Call(t.Context(), Call{Tool: refusing, Arguments: []byte(`{"form": "` + form + `"}`), RequestID: "r7"})
			switch form {
			case "trailer", "early": // dropped, nothing else to refuse
				if err != nil {
					t.Errorf("refusing, %s: %v", form, err)
				}
			default:
				if connect.CodeOf(err) != connect.CodePermissionDenied || !strings.Contains(err.Error(), "the answer of ex echoes its credential and is withheld (request id r7)") {
					t.Errorf("refusing: %v, want permission_denied", err)
				}
			}
		})
	}
	t.Run("clean answer passes a refusing API", func(t *testing.T) {
		t.Parallel()
		res, err := New(nil).Call(t.Context(), Call{Tool: refusing, Arguments: []byte(`{"form": "clean"}`)})
		if err != nil || string(res.Body) != "nothing echoed" {
			t.Fatalf("%+v %v", res, err)
		}
	})
	t.Run("error text names the API, not its base URL", func(t *testing.T) {
		t.Parallel()
		res, err := New(nil).Call(t.Context(), Call{Tool: get, Arguments: []byte(`{"form": "nowhere"}`)})
		if err != nil || res.Status != 404 || res.Path != "/nowhere" || strings.Contains(res.Path, "127.0.0.1") {
			t.Fatalf("%+v %v", res, err)
		}
	})
}
