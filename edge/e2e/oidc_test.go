package e2e

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/codemode-go/codemode/edge/internal/oidctoken/oidctest"
	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/testkit"
)

// edgeAudience is the audience the test edges accept tokens for.
const edgeAudience = "codemode-e2e"

// allScopes grant every right.
var allScopes = []string{"codemode:execute", "codemode:sessions", "codemode:apis"}

var (
	providerOnce sync.Once
	providerErr  error
	provider     *oidctest.Provider
)

// sharedProvider is the OpenID provider of the package's tests, on
// loopback. Its key never changes: a test that rotates keys starts its
// own.
func sharedProvider(t testing.TB) *oidctest.Provider {
	t.Helper()
	providerOnce.Do(func() { provider, providerErr = oidctest.New() })
	if providerErr != nil {
		t.Fatalf("start OpenID provider: %v", providerErr)
	}
	return provider
}

// oidcConfig writes an edge's configuration trusting p's tokens for
// edgeAudience, with org-a and org-b the tenants team-a and team-b.
func oidcConfig(t testing.TB, p *oidctest.Provider, audiences ...string) string {
	t.Helper()
	return oidcConfigFor(t, p, map[string]string{"org-a": "team-a", "org-b": "team-b"}, audiences...)
}

// oidcConfigFor is oidcConfig with the allow-list tenants (org_id ->
// tenant).
func oidcConfigFor(t testing.TB, p *oidctest.Provider, tenants map[string]string, audiences ...string) string {
	t.Helper()
	if len(audiences) == 0 {
		audiences = []string{edgeAudience}
	}
	cfg := map[string]any{"issuers": []map[string]any{{
		"issuer": p.Issuer, "audiences": audiences, "tenantClaim": "org_id",
		"tenants": tenants,
		// Follow a rotation at the first token of a new key.
		"minKeysRefresh": "1ms",
	}}}
	b, _ := json.Marshal(cfg)
	path := filepath.Join(t.TempDir(), "oidc.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// tokenTTL is how long the tokens the tests mint up front stay valid: longer
// than the package's run, not the provider's five minutes, as a test's
// parallel subtests wait for their turn behind the package's other tests (in
// a loaded run the valid token of TestTokensAtEveryDoor, minted before its
// subtests, had expired when they ran).
const tokenTTL = time.Hour

// tenantToken returns a token of p for org (org-a: team-a) with scopes,
// valid for tokenTTL.
func tenantToken(t *testing.T, p *oidctest.Provider, org string, scopes ...string) string {
	t.Helper()
	c := p.Register(oidctest.Client{Audience: []string{edgeAudience}, Claims: map[string]any{"org_id": org}, TTL: tokenTTL})
	return p.Token(t, c, scopes...)
}

// credentialKind names how each of two tenants authenticates.
type credentialKind struct {
	name           string
	tokenA, tokenB bool // else an API key
}

// credentialKinds: two tenants with API keys, with tokens, and one of each.
// Each kind keeps tenants apart the same way.
var credentialKinds = []credentialKind{
	{name: "api keys"},
	{name: "tokens", tokenA: true, tokenB: true},
	{name: "key and token", tokenB: true},
}

// edge starts an edge in front of s that accepts both API keys and the
// shared provider's tokens, and returns it with the credentials of team-a
// and team-b, of kind k.
func (k credentialKind) edge(t *testing.T, s *Stack) (edge *Process, credA, credB string) {
	t.Helper()
	if !k.tokenA && !k.tokenB {
		return keyedEdge(t, s)
	}
	edge, credA, credB = edgeWithKeysAndTokens(t, s)
	p := sharedProvider(t)
	if k.tokenA {
		credA = tenantToken(t, p, "org-a", allScopes...)
	}
	if k.tokenB {
		credB = tenantToken(t, p, "org-b", allScopes...)
	}
	return edge, credA, credB
}

// edgeWithKeysAndTokens starts an edge in front of s with API keys for
// team-a and team-b that also accepts the shared provider's tokens (org-a
// is team-a, org-b team-b), and returns it with the two keys.
func edgeWithKeysAndTokens(t *testing.T, s *Stack) (edge *Process, keyA, keyB string) {
	t.Helper()
	keyA, keyB = "ka-"+newSecret()[:24], "kb-"+newSecret()[:24]
	file := filepath.Join(t.TempDir(), "keys.json")
	b, _ := json.Marshal(map[string]string{keyA: "team-a", keyB: "team-b"})
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	edge, err := s.StartEdge(nil, "--api-keys", file, "--oidc-config", oidcConfig(t, sharedProvider(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { edge.Stop(30 * time.Second) })
	return edge, keyA, keyB
}

// edgeDoor is one of the edge's doors, called with a bearer credential ("":
// none): it returns the HTTP status, the Connect code (for Connect doors,
// else derived from the status) and the WWW-Authenticate header when it
// can see it.
type edgeDoor struct {
	name string
	call func(t *testing.T, base, bearer string) (status int, code connect.Code, challenge string)
}

func httpDoor(name, method, path, body string) edgeDoor {
	return edgeDoor{name: name, call: func(t *testing.T, base, bearer string) (int, connect.Code, string) {
		req, err := http.NewRequestWithContext(t.Context(), method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		code := connect.Code(0)
		switch res.StatusCode {
		case http.StatusUnauthorized:
			code = connect.CodeUnauthenticated
		case http.StatusForbidden:
			code = connect.CodePermissionDenied
		}
		return res.StatusCode, code, res.Header.Get("WWW-Authenticate")
	}}
}

// everyDoor: Connect's Execute on each protocol, both MCP endpoints,
// /run and /status.
func everyDoor() []edgeDoor {
	var doors []edgeDoor
	for _, p := range protocols {
		doors = append(doors, edgeDoor{name: p.name, call: func(t *testing.T, base, bearer string) (int, connect.Code, string) {
			c := edgev1connect.NewExecutionServiceClient(bearerClient(bearer), base, p.opts...)
			_, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(6*7)"}))
			var ce *connect.Error
			challenge := ""
			if err != nil && asConnectError(err, &ce) {
				challenge = ce.Meta().Get("WWW-Authenticate")
			}
			if err == nil {
				return http.StatusOK, 0, ""
			}
			return 0, connect.CodeOf(err), challenge
		}})
	}
	return append(doors,
		httpDoor("mcp", http.MethodPost, "/mcp", mcpInitialize),
		httpDoor("mcp-no-code-execute", http.MethodPost, "/mcp-no-code-execute", mcpInitialize),
		httpDoor("run", http.MethodPost, "/run", `{"code":"print(6*7)","language":"python"}`),
		httpDoor("status", http.MethodGet, "/status", ""),
	)
}

// TestTokensAtEveryDoor: a token of the trusted provider, for this edge's
// audience and a served tenant, opens every door; every kind of bad token
// is refused at every door, with unauthenticated (HTTP 401) when the token
// is not one the edge accepts, permission_denied (403) when it is valid
// but its tenant is not served or its scopes do not grant the call.
func TestTokensAtEveryDoor(t *testing.T) {
	t.Parallel()
	s := shared(t)
	p := sharedProvider(t)
	other := oidctest.Start(t) // a provider the edge does not trust
	edge, err := s.StartEdge(nil, "--oidc-config", oidcConfig(t, p))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { edge.Stop(30 * time.Second) })

	good := tenantToken(t, p, "org-a", allScopes...)
	bad := badTokens{
		expired:       p.Token(t, p.Register(oidctest.Client{Audience: []string{edgeAudience}, Claims: map[string]any{"org_id": "org-a"}, TTL: -time.Minute}), allScopes...),
		wrongAudience: p.Token(t, p.Register(oidctest.Client{Audience: []string{"another-service"}, Claims: map[string]any{"org_id": "org-a"}, TTL: tokenTTL}), allScopes...),
		wrongIssuer:   other.Token(t, other.Register(oidctest.Client{Audience: []string{edgeAudience}, Claims: map[string]any{"org_id": "org-a"}, TTL: tokenTTL}), allScopes...),
		outside:       tenantToken(t, p, "org-unlisted", allScopes...),
		noScope:       tenantToken(t, p, "org-a", "openid"),
	}

	for _, d := range everyDoor() {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			tokensAtDoor(t, d, edge.URL(), p, good, bad)
		})
	}

	// The edge's log names a token's caller by the hash of its issuer and
	// subject, never by the subject itself.
	t.Run("log", func(t *testing.T) {
		t.Parallel()
		logNamesSubjectsByHash(t, edge, p, good)
	})

	// An MCP session belongs to the tenant and subject that opened it: the
	// same user's next token goes on in it (a client that refreshes its
	// token keeps its session); another user of the same tenant gets the
	// 404 of an unknown session.
	t.Run("mcp sessions follow the subject", func(t *testing.T) {
		t.Parallel()
		mcpSessionsFollowTheSubject(t, edge.URL(), p)
	})

	// Scopes grant what they name: a read-only token reads its status but
	// runs nothing; without codemode:sessions a token runs code but opens
	// no session; without codemode:apis it cannot use the API door.
	t.Run("scopes", func(t *testing.T) {
		t.Parallel()
		scopesGrantWhatTheyName(t, edge.URL(), p)
	})
}

// badTokens are the tokens of TestTokensAtEveryDoor that no door takes.
type badTokens struct {
	expired, wrongAudience, wrongIssuer string // not ones the edge accepts
	outside                             string // of a tenant the edge does not serve
	noScope                             string // without any of codemode's scopes
}

// tokensAtDoor checks that door d of the edge at base opens with good, a
// token of p, and refuses every kind of bad token.
func tokensAtDoor(t *testing.T, d edgeDoor, base string, p *oidctest.Provider, good string, bad badTokens) {
	if status, code, _ := d.call(t, base, good); code != 0 {
		t.Fatalf("valid token: HTTP %d %v, want success", status, code)
	}
	for _, tc := range []struct {
		name   string
		bearer string
		want   connect.Code
		scope  string // in the insufficient_scope challenge
	}{
		{"no token", "", connect.CodeUnauthenticated, ""},
		{"expired", bad.expired, connect.CodeUnauthenticated, ""},
		{"wrong audience", bad.wrongAudience, connect.CodeUnauthenticated, ""},
		{"wrong issuer", bad.wrongIssuer, connect.CodeUnauthenticated, ""},
		{"alg none", oidctest.AlgNone(good), connect.CodeUnauthenticated, ""},
		{"HMAC with the public key", p.HMACWithPublicKey(good), connect.CodeUnauthenticated, ""},
		{"another key's signature", oidctest.SignedByAnotherKey(good), connect.CodeUnauthenticated, ""},
		{"tenant outside the allow-list", bad.outside, connect.CodePermissionDenied, ""},
		{"no scope", bad.noScope, connect.CodePermissionDenied, "insufficient_scope"},
	} {
		status, code, challenge := d.call(t, base, tc.bearer)
		if code != tc.want {
			t.Errorf("%s: HTTP %d %v, want %v", tc.name, status, code, tc.want)
		}
		if !strings.HasPrefix(challenge, "Bearer") && (status != 0 || d.name == "connect") {
			t.Errorf("%s: WWW-Authenticate %q, want a Bearer challenge", tc.name, challenge)
		}
		if tc.scope != "" && status != 0 && !strings.Contains(challenge, tc.scope) {
			t.Errorf("%s: WWW-Authenticate %q, want %s", tc.name, challenge, tc.scope)
		}
	}
}

// logNamesSubjectsByHash runs code on edge with good, a token of p, and
// checks that the edge's log names its caller by the hash of its issuer
// and subject, never by the subject itself.
func logNamesSubjectsByHash(t *testing.T, edge *Process, p *oidctest.Provider, good string) {
	sub := subjectOf(t, good)
	sum := sha256.Sum256([]byte(p.Issuer + "\x00" + sub))
	hash := hex.EncodeToString(sum[:16])
	c := edgev1connect.NewExecutionServiceClient(bearerClient(good), edge.URL())
	if _, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"})); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if !strings.Contains(edge.Logs(), `"subject":"`+hash+`"`) {
			return fmt.Errorf("the edge's log has no subject %s", hash)
		}
		return nil
	})
	if strings.Contains(edge.Logs(), `"`+sub+`"`) {
		t.Errorf("the edge's log names the subject %q", sub)
	}
}

// mcpSessionsFollowTheSubject checks, at the edge at base trusting p, that
// an MCP session goes on with its user's next token and is unknown to
// another user of the same tenant.
func mcpSessionsFollowTheSubject(t *testing.T, base string, p *oidctest.Provider) {
	user := p.Register(oidctest.Client{Audience: []string{edgeAudience}, Claims: map[string]any{"org_id": "org-a"}})
	cs := keyedMCP(t, base+"/mcp", p.Token(t, user, allScopes...))
	ping := `{"jsonrpc":"2.0","id":9,"method":"ping"}`
	if got := mcpRequest(t, base+"/mcp", http.MethodPost, ping, p.Token(t, user, allScopes...), cs.ID()); got.status != http.StatusOK {
		t.Errorf("the same user's next token in its session: %s, want 200", got)
	}
	other := tenantToken(t, p, "org-a", allScopes...)
	if got := mcpRequest(t, base+"/mcp", http.MethodPost, ping, other, cs.ID()); got.status != http.StatusNotFound {
		t.Errorf("another user of the tenant in the session: %s, want 404", got)
	}
}

// scopesGrantWhatTheyName checks, at the edge at base trusting p, what a
// read-only token and a token with codemode:execute alone may do.
func scopesGrantWhatTheyName(t *testing.T, base string, p *oidctest.Provider) {
	readOnly := tenantToken(t, p, "org-a", "codemode:read")
	execOnly := tenantToken(t, p, "org-a", "codemode:execute")
	if status, _, _ := httpDoor("status", http.MethodGet, "/status", "").call(t, base, readOnly); status != http.StatusOK {
		t.Errorf("read-only token, /status: HTTP %d, want 200", status)
	}
	c := edgev1connect.NewExecutionServiceClient(bearerClient(readOnly), base)
	_, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"}))
	var ce *connect.Error
	if connect.CodeOf(err) != connect.CodePermissionDenied || !asConnectError(err, &ce) || !strings.Contains(ce.Message(), "codemode:execute") {
		t.Errorf("read-only token, Execute: %v, want permission_denied naming codemode:execute", err)
	}
	if _, err := c.ListLanguages(t.Context(), connect.NewRequest(&edgev1.ListLanguagesRequest{})); err != nil {
		t.Errorf("read-only token, ListLanguages: %v", err)
	}
	e := edgev1connect.NewExecutionServiceClient(bearerClient(execOnly), base)
	if _, err := e.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"})); err != nil {
		t.Errorf("execute token, Execute: %v", err)
	}
	if _, err := e.CreateSession(t.Context(), connect.NewRequest(&edgev1.CreateSessionRequest{Language: "python"})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("execute token, CreateSession: %v, want permission_denied", err)
	}
	if _, err := e.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)", SessionId: "s-" + newSecret()[:8]})); connect.CodeOf(err) != connect.CodePermissionDenied {
		t.Errorf("execute token, Execute in a session: %v, want permission_denied", err)
	}
	if status, _, challenge := httpDoor("mcp-no-code-execute", http.MethodPost, "/mcp-no-code-execute", mcpInitialize).call(t, base, execOnly); status != http.StatusForbidden || !strings.Contains(challenge, `scope="codemode:apis"`) {
		t.Errorf("execute token, /mcp-no-code-execute: HTTP %d %q, want 403 naming codemode:apis", status, challenge)
	}
	// On /mcp, the session tools need codemode:sessions.
	cs := keyedMCP(t, base+"/mcp", execOnly)
	if r := call(t, cs, "execute_code", map[string]any{"language": "python", "code": "print(6*7)"}); r.IsError || structured(t, r)["stdout"] != "42\n" {
		t.Errorf("execute token, execute_code: %s", testkit.ToolText(r))
	}
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_session", Arguments: map[string]any{"language": "python"}})
	if err == nil && !res.IsError {
		t.Errorf("execute token, create_session: %s, want an error", testkit.ToolText(res))
	}
}

// TestTokenKeyRotation: the provider replaces its signing key while the
// edge runs; tokens of the new key work at once, without a restart, and
// tokens of the old key, which the provider no longer publishes, stop
// working as soon as the edge has fetched the new keys, though it had
// accepted (and cached) them before.
func TestTokenKeyRotation(t *testing.T) {
	t.Parallel()
	s := shared(t)
	p := oidctest.Start(t) // its own: the shared provider's key never changes
	edge, err := s.StartEdge(nil, "--oidc-config", oidcConfig(t, p))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { edge.Stop(30 * time.Second) })
	status := httpDoor("status", http.MethodGet, "/status", "")
	old := tenantToken(t, p, "org-a", "codemode:read")
	if code, _, _ := status.call(t, edge.URL(), old); code != http.StatusOK {
		t.Fatalf("before rotation: HTTP %d", code)
	}
	p.Rotate()
	fresh := tenantToken(t, p, "org-a", "codemode:read")
	if code, _, _ := status.call(t, edge.URL(), fresh); code != http.StatusOK {
		t.Fatalf("token of the new key: HTTP %d, want 200 without restarting the edge", code)
	}
	if code, _, _ := status.call(t, edge.URL(), old); code != http.StatusUnauthorized {
		t.Fatalf("token of the retired key: HTTP %d, want 401", code)
	}
}

func asConnectError(err error, target **connect.Error) bool { return errors.As(err, target) }

// TestMCPAuthorization: with an issuer configured, the MCP endpoints are
// OAuth resource servers (MCP authorization, RFC 9728): each serves its
// Protected Resource Metadata naming the provider, answers a request
// without a token with 401 and a challenge pointing to that metadata, a
// bad token with invalid_token, a token without the scope with 403
// insufficient_scope naming it, and a token for another resource with
// 401. Then the official MCP TypeScript SDK's client completes its OAuth
// flow from the 401 alone and runs code (edge/web/test/oauth.test.mjs).
func TestMCPAuthorization(t *testing.T) {
	t.Parallel()
	dir := webDir(t, "@modelcontextprotocol/sdk")
	s := shared(t)
	p := sharedProvider(t)
	addr := freeLoopbackAddr(t)
	base := "http://" + addr
	edge, err := s.StartEdge(nil, "--addr", addr, "--oidc-config", oidcConfig(t, p, base+"/mcp", base+"/mcp-no-code-execute", base+"/no-code/mcp"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { edge.Stop(30 * time.Second) })

	for _, path := range []string{"/mcp", "/mcp-no-code-execute", "/no-code/mcp", ""} {
		res, err := http.Get(base + "/.well-known/oauth-protected-resource" + path)
		if err != nil {
			t.Fatal(err)
		}
		var md struct {
			Resource             string   `json:"resource"`
			AuthorizationServers []string `json:"authorization_servers"`
			ScopesSupported      []string `json:"scopes_supported"`
		}
		err = json.NewDecoder(res.Body).Decode(&md)
		res.Body.Close()
		if err != nil || res.StatusCode != http.StatusOK || md.Resource != base+path ||
			len(md.AuthorizationServers) != 1 || md.AuthorizationServers[0] != p.Issuer || !slices.Contains(md.ScopesSupported, "codemode:execute") {
			t.Errorf("metadata of %q: HTTP %d %+v %v, want resource %s, server %s, scope codemode:execute", path, res.StatusCode, md, err, base+path, p.Issuer)
		}
	}

	tokenFor := func(aud string, scopes ...string) string {
		c := p.Register(oidctest.Client{Audience: []string{aud}, Claims: map[string]any{"org_id": "org-a"}})
		return p.Token(t, c, scopes...)
	}
	good := tokenFor(base+"/mcp", allScopes...)
	for _, tc := range []struct {
		name, path, bearer string
		status             int
		challenge          []string
	}{
		{"no token", "/mcp", "", http.StatusUnauthorized, []string{`resource_metadata="` + base + `/.well-known/oauth-protected-resource/mcp"`}},
		{"no token, no-code", "/mcp-no-code-execute", "", http.StatusUnauthorized, []string{`resource_metadata="` + base + `/.well-known/oauth-protected-resource/mcp-no-code-execute"`}},
		{"forged token", "/mcp", oidctest.SignedByAnotherKey(good), http.StatusUnauthorized, []string{`error="invalid_token"`, `resource_metadata="`}},
		{"token for another resource", "/mcp", tokenFor(base+"/elsewhere", allScopes...), http.StatusUnauthorized, []string{`error="invalid_token"`, "audience"}},
		{"no execute scope", "/mcp", tokenFor(base+"/mcp", "codemode:read"), http.StatusForbidden, []string{`error="insufficient_scope"`, `scope="codemode:execute"`, `resource_metadata="`}},
		{"no apis scope", "/mcp-no-code-execute", tokenFor(base+"/mcp-no-code-execute", "codemode:execute"), http.StatusForbidden, []string{`error="insufficient_scope"`, `scope="codemode:apis"`}},
		{"valid", "/mcp", good, http.StatusOK, nil},
	} {
		status, _, challenge := httpDoor(tc.name, http.MethodPost, tc.path, mcpInitialize).call(t, base, tc.bearer)
		if status != tc.status {
			t.Errorf("%s: HTTP %d, want %d", tc.name, status, tc.status)
		}
		for _, want := range tc.challenge {
			if !strings.HasPrefix(challenge, "Bearer ") || !strings.Contains(challenge, want) {
				t.Errorf("%s: WWW-Authenticate %q, want a Bearer challenge with %s", tc.name, challenge, want)
			}
		}
	}

	redirect := "http://127.0.0.1:9/callback" // never reached: the test reads the redirect
	c := p.Register(oidctest.Client{RedirectURIs: []string{redirect}, Claims: map[string]any{"org_id": "org-a"}})
	nodeTest(t, dir, "oauth.test.mjs", base, edge.Logs, "CODEMODE_OAUTH_CLIENT_ID="+c.ID,
		"CODEMODE_OAUTH_REDIRECT_URI="+redirect, "CODEMODE_OAUTH_ISSUER="+p.Issuer)
}

// TestWebSignInInChromium: with an issuer that has a client for the
// playground, the playground signs the user in through the provider in
// Debian's Chromium (authorization code with PKCE) and runs code with the
// token over gRPC-Web (edge/web/test/signin.test.mjs).
func TestWebSignInInChromium(t *testing.T) {
	t.Parallel()
	dir := webDir(t, "playwright-core")
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("%s is missing: run %s (it runs apt-get install -y chromium)", chromiumPath, webSetup)
	}
	s := shared(t)
	p := sharedProvider(t)
	addr := freeLoopbackAddr(t)
	base := "http://" + addr
	c := p.Register(oidctest.Client{RedirectURIs: []string{base + "/"}, Claims: map[string]any{"org_id": "org-a"}})
	cfg := map[string]any{"issuers": []map[string]any{{
		"issuer": p.Issuer, "audiences": []string{base, base + "/mcp"}, "tenantClaim": "org_id",
		"tenants": map[string]string{"org-a": "team-a"}, "playgroundClientId": c.ID,
	}}}
	b, _ := json.Marshal(cfg)
	file := filepath.Join(t.TempDir(), "oidc.json")
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
	edge, err := s.StartEdge(nil, "--addr", addr, "--oidc-config", file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { edge.Stop(30 * time.Second) })
	nodeTest(t, dir, "signin.test.mjs", base, edge.Logs, "CHROMIUM="+chromiumPath, "CODEMODE_OAUTH_ISSUER="+p.Issuer)
}

// subjectOf returns the sub claim of token (not verified).
func subjectOf(t *testing.T, token string) string {
	t.Helper()
	parts := strings.Split(token, ".")
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Sub string `json:"sub"`
	}
	if err := json.Unmarshal(b, &c); err != nil || c.Sub == "" {
		t.Fatalf("token has no sub: %v", err)
	}
	return c.Sub
}

// TestTokenSubjectReachesPolicies: a Wasm policy sees the hashed subject of
// a caller with a token (RequestInput.subject), and an empty one for an
// API key; the sandbox never gets it.
func TestTokenSubjectReachesPolicies(t *testing.T) {
	t.Parallel()
	s := shared(t)
	p := sharedProvider(t)
	dir := t.TempDir()
	mods, err := policytest.BuildInto(dir, "gohostile")
	if err != nil {
		t.Fatal(err)
	}
	path := mods.Path(t, "gohostile")
	b, _ := json.Marshal(map[string]any{"policies": []map[string]any{{
		"name": "gohostile", "path": filepath.Base(path), "sha256": policytest.Digest(t, path), "phase": "request", "order": 1,
	}}})
	policies := filepath.Join(dir, "policies.json")
	if err := os.WriteFile(policies, b, 0o644); err != nil {
		t.Fatal(err)
	}
	key := "ka-" + newSecret()[:24]
	keys := filepath.Join(dir, "keys.json")
	if err := os.WriteFile(keys, []byte(`{"`+key+`": "team-a"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	edge, err := s.StartEdge(nil, "--api-keys", keys, "--oidc-config", oidcConfig(t, p), "--policy-config", policies)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { edge.Stop(30 * time.Second) })

	token := tenantToken(t, p, "org-a", allScopes...)
	sum := sha256.Sum256([]byte(p.Issuer + "\x00" + subjectOf(t, token)))
	for _, tc := range []struct{ name, bearer, want string }{
		{"token", token, "subject=" + hex.EncodeToString(sum[:16])},
		{"api key", key, "subject="},
	} {
		c := edgev1connect.NewExecutionServiceClient(bearerClient(tc.bearer), edge.URL())
		_, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "subject"}))
		var ce *connect.Error
		if !asConnectError(err, &ce) || ce.Code() != connect.CodePermissionDenied || !strings.HasSuffix(ce.Message(), tc.want) {
			t.Errorf("%s: %v, want the policy's denial ending %q", tc.name, err, tc.want)
		}
	}
	// The sandbox has no trace of it.
	c := edgev1connect.NewExecutionServiceClient(bearerClient(token), edge.URL())
	res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python",
		Code: "import os\nprint(sorted(k for k, v in os.environ.items() if " + fmt.Sprintf("%q", hex.EncodeToString(sum[:16])) + " in v or 'org-a' in v))"}))
	if err != nil || res.Msg.GetResult().GetStdout() != "[]\n" {
		t.Errorf("the sandbox's environment: %v %v, want nothing naming the caller", res.Msg.GetResult(), err)
	}
}
