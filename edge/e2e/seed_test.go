package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/server"
)

// API keys of the seed edge's tenants.
const (
	seedKeyAlice   = "k-seed-alice-0123456789"
	seedKeyBob     = "k-seed-bob-0123456789ab"
	seedKeyMallory = "k-seed-mallory-01234567"
)

// seedRunResult is the answer of the original's POST /run.
type seedRunResult struct {
	Output    string `json:"output"`
	Error     string `json:"error"`
	ExitCode  int    `json:"exitCode"`
	TimedOut  bool   `json:"timedOut"`
	Truncated bool   `json:"truncated"`
}

// seedCall sends method path with body to base, with the API key key when it
// is not empty, and returns the status, the headers and the body.
func seedCall(t *testing.T, method, url, key, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, res.Header, b
}

// seedRun posts a /run of code in language (and session, if not empty) to
// edge with key, and returns the HTTP status and the decoded answer. Every
// answer must carry a request id.
func seedRun(t *testing.T, edge *Process, key, language, code, session string) (int, seedRunResult) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"code": code, "language": language, "sessionId": session})
	status, h, b := seedCall(t, http.MethodPost, edge.URL()+"/run", key, string(body))
	if h.Get(server.RequestIDHeader) == "" {
		t.Errorf("/run answer has no %s header", server.RequestIDHeader)
	}
	var out seedRunResult
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("/run: HTTP %d, body %q: %v", status, b, err)
	}
	return status, out
}

// seedSessionID returns a session id no other test uses.
func seedSessionID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "seed-" + hex.EncodeToString(b[:])
}

// closeSeedSession closes the session id of the tenant of key (none: the
// edge has no keys) when the test ends, so that it gives its sandbox back.
func closeSeedSession(t *testing.T, edge *Process, key, id string) {
	t.Cleanup(func() {
		// t.Context is cancelled by the time cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c := edgev1connect.NewExecutionServiceClient(httpClient, edge.URL())
		req := connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: id})
		if key != "" {
			req.Header().Set("Authorization", "Bearer "+key)
		}
		if _, err := c.CloseSession(ctx, req); err != nil {
			t.Logf("close session %s: %v", id, err)
		}
	})
}

// seedEdge starts an edge in front of the shared stack with API keys for
// alice, bob and mallory, and the tenantblock policy denying mallory.
func seedEdge(t *testing.T, s *Stack) *Process {
	t.Helper()
	dir := t.TempDir()
	mods, err := policytest.BuildInto(dir, "tenantblock")
	if err != nil {
		t.Fatal(err)
	}
	path := mods.Path(t, "tenantblock")
	cfg := map[string]any{
		"policies": []map[string]any{{
			"name": "tenantblock", "path": filepath.Base(path), "sha256": policytest.Digest(t, path),
			"phase": "request", "order": 5, "config": "mallory",
		}},
	}
	return startEdgeWithPolicies(t, s, dir, cfg, map[string]string{seedKeyAlice: "alice", seedKeyBob: "bob", seedKeyMallory: "mallory"})
}

// startEdgeWithPolicies starts an edge of s whose policy configuration is
// cfg (paths relative to dir) and whose API keys are keys (key -> tenant),
// stopped when the test ends.
func startEdgeWithPolicies(t *testing.T, s *Stack, dir string, cfg any, keys map[string]string) *Process {
	t.Helper()
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "policies.json")
	if err := os.WriteFile(config, b, 0o644); err != nil {
		t.Fatal(err)
	}
	kb, err := json.Marshal(keys)
	if err != nil {
		t.Fatal(err)
	}
	keysFile := filepath.Join(dir, "keys.json")
	if err := os.WriteFile(keysFile, kb, 0o600); err != nil {
		t.Fatal(err)
	}
	edge, err := s.StartEdge(nil, "--api-keys", keysFile, "--policy-config", config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = edge.Stop(30 * time.Second) })
	return edge
}

// TestSeedRunAtEdge calls the original's POST /run at the public door, the
// way its users do, on an edge without API keys.
func TestSeedRunAtEdge(t *testing.T) {
	t.Parallel()
	s := shared(t)
	t.Run("print", func(t *testing.T) {
		t.Parallel()
		status, out := seedRun(t, s.Edge, "", "python", "print(6*7)", "")
		if status != http.StatusOK || out != (seedRunResult{Output: "42\n"}) {
			t.Fatalf("HTTP %d %+v, want 200 output 42\n%s", status, out, s.Logs())
		}
	})
	t.Run("language defaults to python and ignores case", func(t *testing.T) {
		t.Parallel()
		for _, lang := range []string{"", "Python"} {
			status, out := seedRun(t, s.Edge, "", lang, "import sys; print(sys.version_info[0])", "")
			if status != http.StatusOK || out.Output != "3\n" {
				t.Errorf("language %q: HTTP %d %+v, want 200 output 3", lang, status, out)
			}
		}
	})
	t.Run("failing program", func(t *testing.T) {
		t.Parallel()
		status, out := seedRun(t, s.Edge, "", "python", "import sys\nprint('before')\nsys.stderr.write('boom')\nsys.exit(3)", "")
		if status != http.StatusOK || out != (seedRunResult{Output: "before\n", Error: "boom\nexit status 3", ExitCode: 3}) {
			t.Fatalf("HTTP %d %+v, want 200, output before, error boom and exit status 3", status, out)
		}
	})
	t.Run("session keeps state", func(t *testing.T) {
		t.Parallel()
		id := seedSessionID()
		closeSeedSession(t, s.Edge, "", id)
		if status, out := seedRun(t, s.Edge, "", "python", "x = 41", id); status != http.StatusOK || out.ExitCode != 0 {
			t.Fatalf("first run: HTTP %d %+v", status, out)
		}
		if status, out := seedRun(t, s.Edge, "", "python", "print(x + 1)", id); status != http.StatusOK || out.Output != "42\n" {
			t.Fatalf("second run: HTTP %d %+v, want output 42", status, out)
		}
	})
	t.Run("refusals keep the original's shape", func(t *testing.T) {
		t.Parallel()
		status, out := seedRun(t, s.Edge, "", "cobol", "DISPLAY 'HI'.", "")
		if status != http.StatusBadRequest || out.Output != "" || out.ExitCode != -1 || !strings.Contains(out.Error, "language") {
			t.Errorf("unknown language: HTTP %d %+v, want 400 about the language, exit code -1", status, out)
		}
		status, h, b := seedCall(t, http.MethodGet, s.Edge.URL()+"/run", "", "")
		if status != http.StatusMethodNotAllowed || h.Get("Allow") != http.MethodPost {
			t.Errorf("GET /run: HTTP %d Allow %q %s, want 405 Allow POST", status, h.Get("Allow"), b)
		}
		big := `{"code":"` + strings.Repeat("x", 3<<20) + `"}`
		if status, _, b := seedCall(t, http.MethodPost, s.Edge.URL()+"/run", "", big); status != http.StatusRequestEntityTooLarge {
			t.Errorf("3 MiB body: HTTP %d %.200s, want 413", status, b)
		}
	})
}

// TestSeedStatusAtEdge reads GET /status at the public door: agents by name,
// never their addresses.
func TestSeedStatusAtEdge(t *testing.T) {
	t.Parallel()
	s := shared(t)
	edge := seedEdge(t, s)
	_, agentPort, _ := net.SplitHostPort(s.Agent.Addr)
	_, cpPort, _ := net.SplitHostPort(s.ControlPlane.Addr)
	for _, tc := range []struct {
		name string
		edge *Process
		key  string
	}{
		{"without keys", s.Edge, ""},
		{"with a key", edge, seedKeyAlice},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			status, h, b := seedCall(t, http.MethodGet, tc.edge.URL()+"/status", tc.key, "")
			if status != http.StatusOK || h.Get(server.RequestIDHeader) == "" {
				t.Fatalf("GET /status: HTTP %d (request id %q) %s", status, h.Get(server.RequestIDHeader), b)
			}
			for _, secret := range []string{"127.0.0.1", "localhost", agentPort, cpPort, "address"} {
				if strings.Contains(string(b), secret) {
					t.Errorf("/status %s reveals %q", b, secret)
				}
			}
			var out struct {
				Status        string
				HealthyAgents int
				Agents        []struct {
					Name     string
					Healthy  bool
					Capacity int
				}
				Languages []struct{ Name string }
			}
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			if out.Status != "ok" || out.HealthyAgents < 1 {
				t.Errorf("/status %s, want ok with a healthy agent", b)
			}
			found := false
			for _, a := range out.Agents {
				found = found || (a.Name == s.AgentName && a.Healthy && a.Capacity > 0)
			}
			if !found {
				t.Errorf("/status %s does not list the healthy agent %q", b, s.AgentName)
			}
			var langs []string
			for _, l := range out.Languages {
				langs = append(langs, l.Name)
			}
			if !strings.Contains(","+strings.Join(langs, ",")+",", ",python,") {
				t.Errorf("/status languages %v lack python", langs)
			}
		})
	}
	t.Run("without a key", func(t *testing.T) {
		t.Parallel()
		if status, _, b := seedCall(t, http.MethodGet, edge.URL()+"/status", "", ""); status != http.StatusUnauthorized {
			t.Fatalf("GET /status without a key: HTTP %d %s, want 401", status, b)
		}
	})
}

// TestSeedTenantsAndPolicies calls /run on an edge with API keys and a
// policy: the door authenticates, scopes sessions to tenants and runs the
// policies like every other.
func TestSeedTenantsAndPolicies(t *testing.T) {
	t.Parallel()
	s := shared(t)
	edge := seedEdge(t, s)
	t.Run("authentication", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct{ name, key string }{{"no key", ""}, {"wrong key", "k-seed-nobody-0123456789"}} {
			status, h, b := seedCall(t, http.MethodPost, edge.URL()+"/run", tc.key, `{"code":"print(1)","language":"python"}`)
			if status != http.StatusUnauthorized || !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s: HTTP %d %s, want 401 with a Bearer challenge", tc.name, status, b)
			}
		}
		if status, out := seedRun(t, edge, seedKeyAlice, "python", "print(6*7)", ""); status != http.StatusOK || out.Output != "42\n" {
			t.Fatalf("alice: HTTP %d %+v, want 200 output 42\n%s", status, out, s.Logs())
		}
	})
	t.Run("tenants' sessions are apart", func(t *testing.T) {
		t.Parallel()
		id := seedSessionID()
		closeSeedSession(t, edge, seedKeyAlice, id)
		closeSeedSession(t, edge, seedKeyBob, id)
		if status, out := seedRun(t, edge, seedKeyAlice, "python", "x = 'alice'\nopen('note.txt', 'w').write('alice')", id); status != http.StatusOK || out.ExitCode != 0 {
			t.Fatalf("alice's first run: HTTP %d %+v", status, out)
		}
		status, out := seedRun(t, edge, seedKeyBob, "python", "import os\nprint(globals().get('x'), os.path.exists('note.txt'))", id)
		if status != http.StatusOK || out.Output != "None False\n" {
			t.Fatalf("bob in the same session id: HTTP %d %+v, want his own empty session (None False)", status, out)
		}
		status, out = seedRun(t, edge, seedKeyAlice, "python", "print(x, open('note.txt').read())", id)
		if status != http.StatusOK || out.Output != "alice alice\n" {
			t.Fatalf("alice's second run: HTTP %d %+v, want her state", status, out)
		}
	})
	t.Run("policy denial", func(t *testing.T) {
		t.Parallel()
		status, out := seedRun(t, edge, seedKeyMallory, "python", "print(1)", "")
		if status != http.StatusForbidden || out.Output != "" || out.ExitCode != -1 ||
			!strings.Contains(out.Error, "tenantblock") || !strings.Contains(out.Error, "tenant is suspended by the tenant policy") {
			t.Fatalf("mallory: HTTP %d %+v, want 403 naming tenantblock and its reason, exit code -1", status, out)
		}
	})
}

// seedRunStdin posts a stateless run with standard input to the edge's
// POST /run (no keys).
func seedRunStdin(t *testing.T, edge *Process, language, code, stdin string) (int, seedRunResult) {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"code": code, "language": language, "stdin": stdin})
	status, _, b := seedCall(t, http.MethodPost, edge.URL()+"/run", "", string(body))
	var out seedRunResult
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("/run: HTTP %d, body %q: %v", status, b, err)
	}
	return status, out
}
