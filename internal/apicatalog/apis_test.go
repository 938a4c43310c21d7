package apicatalog

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/codemode-go/codemode/internal/secretfile"
)

func TestDefault(t *testing.T) {
	t.Parallel()
	c := Default()
	if len(c.APIs()) != 1 {
		t.Fatalf("%d APIs, want github alone", len(c.APIs()))
	}
	gh, ok := c.Lookup("github")
	if !ok || gh.BaseURL.String() != "https://api.github.com" || gh.Host() != "github.api.codemode" {
		t.Fatalf("github: %+v %v", gh, ok)
	}
	var names []string
	for _, tool := range gh.Tools {
		names = append(names, tool.Name)
		if !tool.ReadOnly || tool.Method != http.MethodGet {
			t.Errorf("%s: %s, read-only %v", tool.Name, tool.Method, tool.ReadOnly)
		}
	}
	want := []string{"github_list_user_repos", "github_list_user_pull_requests", "github_list_user_closed_pull_requests", "github_list_user_issues"}
	if !slices.Equal(names, want) {
		t.Errorf("tools %v, want %v", names, want)
	}
	if gh.CredentialHeader() != "Authorization" {
		t.Errorf("credential header %q", gh.CredentialHeader())
	}
}

func TestByHost(t *testing.T) {
	t.Parallel()
	c := Default()
	for host, want := range map[string]bool{
		"github.api.codemode":          true,
		"GitHub.API.codemode":          true,
		"github.api.codemode:80":       true,
		"github.api.codemode.":         true,
		"gitlab.api.codemode":          false,
		"api.codemode":                 false,
		".api.codemode":                false,
		"github.api.codemode.evil.com": false,
		"github":                       false,
		"api.github.com":               false,
	} {
		if _, ok := c.ByHost(host); ok != want {
			t.Errorf("ByHost(%q) = %v, want %v", host, ok, want)
		}
	}
	if _, ok := (*Catalog)(nil).ByHost("github.api.codemode"); ok {
		t.Error("a nil catalog found an API")
	}
}

func TestMSGraphExample(t *testing.T) {
	t.Parallel()
	path := filepath.Join("examples", "msgraph.json")
	env := func(k string) string {
		if k == "CODEMODE_MSGRAPH_TOKEN" {
			return "graph-token-0123"
		}
		return ""
	}
	c, err := Load(path, WithGetenv(env))
	if err != nil {
		t.Fatal(err)
	}
	g, _ := c.Lookup("msgraph")
	if g.BaseURL.String() != "https://graph.microsoft.com/v1.0" || len(g.Tools) < 6 {
		t.Fatalf("msgraph: %s, %d tools", g.BaseURL, len(g.Tools))
	}
	h, err := g.Header(t.Context())
	if err != nil || h.Get("Authorization") != "Bearer graph-token-0123" {
		t.Fatalf("header %v %v", h, err)
	}

	avail, _ := c.Tool("msgraph_availability")
	if !avail.ReadOnly || avail.Method != http.MethodPost {
		t.Errorf("msgraph_availability: %s read-only %v", avail.Method, avail.ReadOnly)
	}
	call, err := avail.NewCall(json.RawMessage(`{"addresses": ["ada@example.com"], "start": "2026-03-02T08:00:00", "end": "2026-03-02T18:00:00"}`))
	if err != nil {
		t.Fatal(err)
	}
	var body map[string]any
	if err := json.Unmarshal(call.Body, &body); err != nil {
		t.Fatal(err)
	}
	if call.URL.String() != "https://graph.microsoft.com/v1.0/me/calendar/getSchedule" ||
		body["availabilityViewInterval"] != float64(30) || !slices.Equal(body["schedules"].([]any), []any{"ada@example.com"}) ||
		body["startTime"].(map[string]any)["timeZone"] != "UTC" {
		t.Errorf("getSchedule: %s %s", call.URL, call.Body)
	}

	mail, _ := c.Tool("msgraph_list_messages")
	call, err = mail.NewCall(nil)
	if err != nil {
		t.Fatal(err)
	}
	if q := call.URL.Query(); q.Get("$top") != "25" || q.Has("$search") {
		t.Errorf("messages without search: %s", call.URL)
	}
	call, _ = mail.NewCall(json.RawMessage(`{"search": "budget 2026"}`))
	if q := call.URL.Query(); q.Get("$search") != `"budget 2026"` {
		t.Errorf("messages with search: %s", call.URL)
	}

	// Without a secret the example does not load, and says where it looked.
	_, err = Load(path, WithGetenv(func(string) string { return "" }))
	if err == nil || !strings.Contains(err.Error(), "CODEMODE_MSGRAPH_TOKEN") || !strings.Contains(err.Error(), "/run/secrets/msgraph-token") {
		t.Errorf("no secret: %v", err)
	}
}

func TestCalls(t *testing.T) {
	t.Parallel()
	c, err := Parse([]byte(`{"apis": [{"name": "ex", "base_url": "http://127.0.0.1:9/base/", "tools": [
		{"name": "ex_get", "description": "d", "path": "/items/{id}/x{suffix}",
		 "query": {"n": "{n}", "flag": "{flag}", "q": "kind:{kind} fixed", "lit": "1"},
		 "parameters": {"type": "object", "properties": {
			"id": {"type": "string"}, "suffix": {"type": "string", "default": "y"},
			"n": {"type": "integer"}, "flag": {"type": "boolean"}, "kind": {"type": "string"}},
		  "required": ["id"]}},
		{"name": "ex_post", "description": "d", "method": "post", "path": "/p",
		 "body": {"a": "{a}", "b": ["{b}", "x"], "c": {"d": "v={d}"}, "e": 1.50},
		 "parameters": {"type": "object", "properties": {"a": {}, "b": {"type": "string"}, "d": {"type": "number"}}}}
	]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	get, _ := c.Tool("ex_get")
	post, _ := c.Tool("ex_post")
	for _, tc := range []struct {
		name    string
		tool    *Tool
		args    string
		url     string
		body    string
		wantErr string
	}{
		{name: "absent query arguments are left out", tool: get, args: `{"id": "7"}`,
			url: "http://127.0.0.1:9/base/items/7/xy?lit=1"},
		{name: "every argument", tool: get, args: `{"id": "7", "suffix": "z", "n": 100, "flag": false, "kind": "a&b=c"}`,
			url: "http://127.0.0.1:9/base/items/7/xz?flag=false&lit=1&n=100&q=kind%3Aa%26b%3Dc+fixed"},
		{name: "a slash stays in its segment", tool: get, args: `{"id": "a/../b?c#d"}`,
			url: "http://127.0.0.1:9/base/items/a%2F..%2Fb%3Fc%23d/xy?lit=1"},
		{name: "dot-dot as a segment", tool: get, args: `{"id": ".."}`, wantErr: `".." cannot be a segment`},
		{name: "dot as a segment", tool: get, args: `{"id": "."}`, wantErr: `"." cannot be a segment`},
		{name: "empty segment", tool: get, args: `{"id": ""}`, wantErr: `"" cannot be a segment`},
		{name: "missing required", tool: get, args: `{}`, wantErr: "id"},
		{name: "wrong type", tool: get, args: `{"id": "1", "n": "ten"}`, wantErr: "n"},
		{name: "not an object", tool: get, args: `[1]`, wantErr: "not a JSON object"},
		{name: "body", tool: post, args: `{"a": {"x": [1, true]}, "b": "B", "d": 2.5}`,
			url: "http://127.0.0.1:9/base/p", body: `{"a":{"x":[1,true]},"b":["B","x"],"c":{"d":"v=2.5"},"e":1.50}`},
		{name: "body without arguments", tool: post, args: ``,
			url: "http://127.0.0.1:9/base/p", body: `{"b":["x"],"c":{},"e":1.50}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			call, err := tc.tool.NewCall(json.RawMessage(tc.args))
			if tc.wantErr != "" {
				if err == nil || !errors.Is(err, ErrArguments) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want ErrArguments saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if call.URL.String() != tc.url || string(call.Body) != tc.body {
				t.Errorf("got %s %s, want %s %s", call.URL, call.Body, tc.url, tc.body)
			}
		})
	}
}

func TestInvalidDeclarations(t *testing.T) {
	t.Parallel()
	api := func(fields string) string {
		return `{"apis": [{"name": "ex", "base_url": "https://127.0.0.1", ` + fields + `}]}`
	}
	tool := func(fields string) string {
		return api(`"tools": [{"name": "ex_t", "description": "d", ` + fields + `}]`)
	}
	for _, tc := range []struct{ name, decl, want string }{
		{"unknown field", `{"apis": [{"name": "ex", "base_url": "https://127.0.0.1", "secret": "x"}]}`, "unknown field"},
		{"not JSON", `{"apis": [`, "parse"},
		{"bad API name", `{"apis": [{"name": "Ex", "base_url": "https://127.0.0.1"}]}`, `api "Ex": the name must match`},
		{"long API name", `{"apis": [{"name": "` + strings.Repeat("a", 32) + `", "base_url": "https://127.0.0.1"}]}`, "the name must match"},
		{"API twice", `{"apis": [{"name": "ex", "base_url": "https://127.0.0.1"}, {"name": "ex", "base_url": "https://127.0.0.1"}]}`, "declared twice"},
		{"relative base URL", `{"apis": [{"name": "ex", "base_url": "/v1"}]}`, "absolute http"},
		{"ftp base URL", `{"apis": [{"name": "ex", "base_url": "ftp://127.0.0.1"}]}`, "absolute http"},
		{"base URL with query", `{"apis": [{"name": "ex", "base_url": "https://127.0.0.1/?a=b"}]}`, "no query"},
		{"base URL with user", `{"apis": [{"name": "ex", "base_url": "https://u:p@127.0.0.1/"}]}`, "user information"},
		{"bad header", api(`"headers": {"X-A": "a\nb"}`), "cannot carry"},
		{"Host header", api(`"headers": {"host": "x"}`), "set by the HTTP client"},
		{"credential without source", api(`"credential": {"header": "Authorization"}`), "secret_env, secret_file"},
		{"credential missing", api(`"credential": {"header": "Authorization", "secret_env": "CODEMODE_TEST_NO_SUCH_VAR"}`), "not optional"},
		{"tool name without API", api(`"tools": [{"name": "t", "description": "d", "path": "/"}]`), `must start with "ex_"`},
		{"tool name only the prefix", api(`"tools": [{"name": "ex_", "description": "d", "path": "/"}]`), `must start with "ex_"`},
		{"tool twice", api(`"tools": [{"name": "ex_t", "description": "d", "path": "/"}, {"name": "ex_t", "description": "d", "path": "/"}]`), "taken"},
		{"no description", api(`"tools": [{"name": "ex_t", "path": "/"}]`), "no description"},
		{"method", tool(`"method": "TRACE", "path": "/"`), "method"},
		{"relative path", tool(`"path": "x"`), "does not start with /"},
		{"query in path", tool(`"path": "/x?a=1"`), `put the query in "query"`},
		{"dot segment", tool(`"path": "/a/../b"`), "dot segments"},
		{"undeclared placeholder", tool(`"path": "/u/{user}"`), "{user}, which is not among"},
		{"optional path placeholder", tool(`"path": "/u/{user}", "parameters": {"type": "object", "properties": {"user": {"type": "string"}}}`), "neither require nor give a default"},
		{"untyped placeholder", tool(`"path": "/", "query": {"a": "{a}"}, "parameters": {"type": "object", "properties": {"a": {}}}`), "has no type"},
		{"object placeholder", tool(`"path": "/", "query": {"a": "{a}"}, "parameters": {"type": "object", "properties": {"a": {"type": "object"}}}`), "of type object"},
		{"lone brace", tool(`"path": "/u/{user"`), "without '}'"},
		{"lone closing brace", tool(`"path": "/", "query": {"a": "b}"}`), "without '{'"},
		{"bad placeholder", tool(`"path": "/{a-b}"`), "a placeholder is {name}"},
		{"GET with body", tool(`"path": "/", "body": {"a": 1}`), "has no body"},
		{"body placeholder", tool(`"method": "POST", "path": "/", "body": {"a": "{a}"}`), "{a}, which is not among"},
		{"schema not an object", tool(`"path": "/", "parameters": {"type": "string"}`), `type must be "object"`},
		{"schema invalid", tool(`"path": "/", "parameters": {"type": "object", "properties": {"a": {"type": 3}}}`), "parameters"},
		{"bad default", tool(`"path": "/", "parameters": {"type": "object", "properties": {"a": {"type": "integer", "default": "x"}}}`), "parameters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse([]byte(tc.decl), WithGetenv(func(string) string { return "" }))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse: %v, want an error saying %q", err, tc.want)
			}
		})
	}
	if _, err := Parse(DefaultDeclaration(), WithBaseURL("gitlab", "http://127.0.0.1:1")); err == nil || !strings.Contains(err.Error(), "gitlab") {
		t.Errorf("base URL for an undeclared API: %v", err)
	}
}

func TestCredential(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte("file-token-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	decl := `{"apis": [{"name": "ex", "base_url": "http://127.0.0.1:9", "headers": {"Accept": "application/json"},
		"credential": {"header": "X-Api-Key", "secret_env": "EX_TOKEN", "secret_file": "` + file + `"}}]}`
	c, err := Parse([]byte(decl), WithGetenv(func(k string) string { return env[k] }))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := c.Lookup("ex")
	header := func() string {
		t.Helper()
		h, err := a.Header(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if h.Get("Accept") != "application/json" {
			t.Errorf("declared header lost: %v", h)
		}
		return h.Get("X-Api-Key")
	}
	if got := header(); got != "file-token-1" {
		t.Errorf("from the file: %q", got)
	}
	if err := os.WriteFile(file, []byte("file-token-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := header(); got != "file-token-2" {
		t.Errorf("after the file changed: %q", got)
	}
	env["EX_TOKEN"] = "env-token"
	if got := header(); got != "env-token" {
		t.Errorf("the variable comes first: %q", got)
	}
	delete(env, "EX_TOKEN")
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	_, err = a.Header(t.Context())
	if err == nil || strings.Contains(err.Error(), dir) || strings.Contains(err.Error(), "token-") {
		t.Errorf("a missing secret file: %v, want an error naming neither the file nor a secret", err)
	}

	h := http.Header{"X-Api-Key": {"s3cr3t-value"}}
	for _, tc := range []struct {
		in   string
		cut  bool
		want string
	}{
		{`{"echo": "s3cr3t-value", "again": "s3cr3t-value"}`, false, `{"echo": "[REDACTED]", "again": "[REDACTED]"}`},
		{`{"echo": "s3cr3t-value", "again": "s3cr3t-va`, true, `{"echo": "[REDACTED]", "again": "`},
		{`{"echo": "s3cr3t-va`, false, `{"echo": "s3cr3t-va`},
		{`nothing to see`, true, `nothing to see`},
	} {
		if got := string(a.Redact(h, []byte(tc.in), tc.cut)); got != tc.want {
			t.Errorf("Redact(%q, cut %v) = %q, want %q", tc.in, tc.cut, got, tc.want)
		}
	}

	// An optional credential with no secret sends no header.
	opt, err := Parse([]byte(`{"apis": [{"name": "ex", "base_url": "http://127.0.0.1:9",
		"credential": {"header": "Authorization", "prefix": "Bearer ", "secret_file": "` + filepath.Join(dir, "none") + `", "optional": true}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	oa, _ := opt.Lookup("ex")
	if h, err := oa.Header(t.Context()); err != nil || h.Get("Authorization") != "" {
		t.Errorf("optional, absent: %v %v", h, err)
	}
}

func TestCodeURL(t *testing.T) {
	t.Parallel()
	c, err := Parse([]byte(`{"apis": [{"name": "graph", "base_url": "https://127.0.0.1:8443/v1.0/"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	g, _ := c.Lookup("graph")
	for _, tc := range []struct{ path, query, want string }{
		{"/me", "", "https://127.0.0.1:8443/v1.0/me"},
		{"", "", "https://127.0.0.1:8443/v1.0/"},
		{"/me/messages", "$top=5", "https://127.0.0.1:8443/v1.0/me/messages?$top=5"},
		{"/sites/a%2Fb", "", "https://127.0.0.1:8443/v1.0/sites/a%2Fb"},
		{"//evil.example/x", "", "https://127.0.0.1:8443/v1.0//evil.example/x"},
		{"/../beta/me", "", ""},
		{"/%2e%2e/beta", "", ""},
		{"me", "", ""},
	} {
		u, err := g.URL(tc.path, tc.query)
		got := ""
		if err == nil {
			got = u.String()
		}
		if got != tc.want {
			t.Errorf("URL(%q, %q) = %q (%v), want %q", tc.path, tc.query, got, err, tc.want)
		}
	}
}

// FuzzNewCall checks that no arguments make a tool's request leave its
// API's base URL, or make a path with dot segments.
func FuzzNewCall(f *testing.F) {
	c, err := Parse([]byte(`{"apis": [{"name": "ex", "base_url": "http://127.0.0.1:9/base", "tools": [
		{"name": "ex_get", "description": "d", "path": "/items/{id}/x{n}", "query": {"q": "a:{q}"},
		 "parameters": {"type": "object", "properties": {"id": {"type": "string"}, "n": {"type": ["integer", "string"]}, "q": {"type": "string"}}, "required": ["id", "n"]}}]}]}`))
	if err != nil {
		f.Fatal(err)
	}
	tool, _ := c.Tool("ex_get")
	for _, s := range []string{`{"id": "7", "n": 1}`, `{"id": "..", "n": ""}`, `{"id": "a/b", "n": "/../"}`, `{"id": "%2e%2e", "n": 3, "q": "x&y"}`, `[]`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, args []byte) {
		call, err := tool.NewCall(args)
		if err != nil {
			if !errors.Is(err, ErrArguments) {
				t.Fatalf("error %v does not wrap ErrArguments", err)
			}
			return
		}
		u := call.URL
		if u.Scheme != "http" || u.Host != "127.0.0.1:9" || !strings.HasPrefix(u.EscapedPath(), "/base/items/") || u.Fragment != "" {
			t.Fatalf("args %s made %s", args, u)
		}
		if hasDotSegment(u) {
			t.Fatalf("args %s made %s, with dot segments", args, u)
		}
		if got := strings.Count(u.EscapedPath(), "/"); got != 4 {
			t.Fatalf("args %s made %s: %d slashes, want 4", args, u, got)
		}
	})
}

// FuzzParse checks that no declaration makes Parse panic.
func FuzzParse(f *testing.F) {
	f.Add(DefaultDeclaration())
	f.Add([]byte(`{"apis": [{"name": "ex", "base_url": "http://127.0.0.1", "tools": [{"name": "ex_a", "description": "d", "method": "POST", "path": "/{a}", "body": ["{a}", {"k": "x{a}y"}], "parameters": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Parse(b, WithGetenv(func(string) string { return "x" }))
		if err != nil {
			return
		}
		for _, a := range c.APIs() {
			for _, tool := range a.Tools {
				_, _ = tool.NewCall(json.RawMessage(`{}`))
			}
		}
	})
}

// FuzzRedact checks that no body keeps a secret, whole or (when cut) the
// start of one at its end; and that the secret written into the body in
// one of the forms a Redactor finds (chosen by form: raw, JSON escapes,
// percent-encoding, a mix, base64 at any alignment, those escaped) is
// redacted, the same when the body is read in pieces (their sizes also
// from form). Secrets are taken as tokens are: 8 or more letters, digits
// and "-._~+/".
func FuzzRedact(f *testing.F) {
	f.Add([]byte("echo: tok3n-tok3n"), "tok3ntok3n", true, uint64(0))
	f.Add([]byte("tok3ntok3ntok3nto"), "tok3ntok3n", true, uint64(1))
	f.Add([]byte("ttttttttttttttttt"), "tttttttt", false, uint64(2))
	f.Add([]byte(`{"a": "\u00", "b": "%2"}`), "ghp_ab/cd+ef", false, uint64(0x5a5a5a5a_5a5a5a53))
	f.Add([]byte("dXNlcjp"), "s3cr3t-t0ken", false, uint64(0xf4))
	f.Add([]byte("%%%%\\\\"), "a/b+c-d_e.f~", false, uint64(0xffff_0005))
	f.Fuzz(func(t *testing.T, b []byte, secret string, cut bool, form uint64) {
		if len(secret) < 8 || strings.IndexFunc(secret, func(r rune) bool {
			return !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || strings.ContainsRune("-._~+/", r))
		}) >= 0 {
			return
		}
		c, err := Parse([]byte(`{"apis": [{"name": "ex", "base_url": "http://127.0.0.1:9", "credential": {"header": "X-Key", "prefix": "Token ", "secret_env": "K"}}]}`),
			WithGetenv(func(string) string { return secret }))
		if err != nil {
			t.Fatal(err)
		}
		a, _ := c.Lookup("ex")
		h, err := a.Header(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		out := a.Redact(h, b, cut)
		if strings.Contains(string(out), secret) {
			t.Fatalf("Redact(%q) = %q keeps the secret %q", b, out, secret)
		}
		// Where the body might go on with the rest of the secret, that
		// start is not kept. (Checked when nothing was replaced, so that
		// what was kept is a prefix of b.)
		for k := 1; cut && k < len(secret) && strings.HasPrefix(string(b), string(out)); k++ {
			if strings.HasSuffix(string(b), secret[:k]) && len(out) > len(b)-k {
				t.Fatalf("Redact(%q, cut) = %q keeps the start of the secret %q", b, out, secret)
			}
		}

		// The secret in one of its forms, amid b.
		mask := form >> 8
		var enc string
		switch form % 8 {
		case 0:
			enc = secret
		case 1:
			enc = jsonEscape(secret, mask, form&8 != 0)
		case 2:
			enc = percentEscape(secret, mask, form&8 != 0)
		case 3:
			enc = mixEscape(secret, mask)
		case 4, 5, 6, 7:
			// Base64 of the secret after 0 to 3 other bytes, and before
			// some; std or URL alphabet, padded or not; perhaps escaped.
			pre := strings.Repeat("u", int(form>>8)%4)
			encs := []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding}
			enc = encs[form>>10%4].EncodeToString([]byte(pre + secret + strings.Repeat(":", int(form>>12)%3)))
			switch form % 8 {
			case 6:
				enc = jsonEscape(enc, form>>14, form&8 != 0)
			case 7:
				enc = percentEscape(enc, form>>14, form&8 != 0)
			}
		}
		half := len(b) / 2
		body := string(b[:half]) + enc + string(b[half:])
		red := a.Redactor(h)
		got, err := red.Bytes([]byte(body))
		if err != nil || strings.Contains(string(got), enc) || strings.Contains(string(got), secret) {
			t.Fatalf("Bytes(%q) = %q, %v: keeps the secret %q written %q", body, got, err, secret, enc)
		}
		if !red.Found([]byte(body)) {
			t.Fatalf("Found(%q) = false: misses the secret %q written %q", body, secret, enc)
		}
		streamed, err := io.ReadAll(red.Reader(io.NopCloser(&pieces{s: body, sizes: form | 1})))
		if err != nil || string(streamed) != string(got) {
			t.Fatalf("read in pieces, %q is %q, %v; whole, %q", body, streamed, err, got)
		}
	})
}

func TestCredentialSecretFileMustBeTheServicesOwn(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	const token = "file-token-0123456789"
	if err := os.WriteFile(file, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, 0o644); err != nil {
		t.Fatal(err)
	}
	decl := []byte(`{"apis": [{"name": "ex", "base_url": "http://127.0.0.1:9",
		"credential": {"header": "X-Api-Key", "secret_file": "` + file + `", "optional": true}}]}`)
	_, err := Parse(decl)
	if !errors.Is(err, secretfile.ErrExposed) || !strings.Contains(err.Error(), "chmod 600 "+file) || strings.Contains(err.Error(), token) {
		t.Fatalf("load with a secret file of mode 0644: %v, want a refusal saying chmod 600 %s, without the secret", err, file)
	}

	// Loaded while the service's own, then opened to others: every
	// request is refused, without the secret or the file's name.
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Parse(decl)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := c.Lookup("ex")
	if h, err := a.Header(t.Context()); err != nil || h.Get("X-Api-Key") != token {
		t.Fatalf("mode 0600: %v %v, want the secret sent", h, err)
	}
	if err := os.Chmod(file, 0o640); err != nil {
		t.Fatal(err)
	}
	h, err := a.Header(t.Context())
	if !errors.Is(err, secretfile.ErrExposed) || h != nil {
		t.Fatalf("mode 0640: %v %v, want a refusal", h, err)
	}
	if strings.Contains(err.Error(), dir) || strings.Contains(err.Error(), token) {
		t.Errorf("the refusal %q names the file or the secret", err)
	}
}

// pieces reads s in pieces of 1 to 16 bytes, their sizes taken from sizes
// four bits at a time.
type pieces struct {
	s     string
	sizes uint64
	i     int
}

func (p *pieces) Read(b []byte) (int, error) {
	if len(p.s) == 0 {
		return 0, io.EOF
	}
	n := int(p.sizes>>(4*(p.i%16))&15) + 1
	p.i++
	n = min(n, len(p.s), len(b))
	copy(b, p.s[:n])
	p.s = p.s[n:]
	return n, nil
}
