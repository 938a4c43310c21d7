package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// TestTenantSessionLimits: through the edge, a tenant that holds
// --max-sessions-per-tenant sessions is refused another on every door,
// with an error naming the limit, while another tenant still opens one; an
// idle timeout above --max-session-idle-ttl is refused; and GET /status
// shows each tenant its own sessions and no load. A tenant's token is the
// tenant: it meets the limit its keys reached and sees the same sessions.
func TestTenantSessionLimits(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	s, err := StartStack("e2e-tenant-limits", "--min-active", "1", "--max-sandboxes", "4",
		"--max-sessions", "3", "--max-sessions-per-tenant", "2", "--max-session-idle-ttl", "1h")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	edge, keyA, keyB := edgeWithKeysAndTokens(t, s)
	a := edgev1connect.NewExecutionServiceClient(bearerClient(keyA), edge.URL())
	b := edgev1connect.NewExecutionServiceClient(bearerClient(keyB), edge.URL())
	ctx := t.Context()
	open := func(c edgev1connect.ExecutionServiceClient, idle time.Duration) (string, error) {
		req := &edgev1.CreateSessionRequest{Language: "bash"}
		if idle > 0 {
			req.IdleTimeout = durationpb.New(idle)
		}
		res, err := c.CreateSession(ctx, connect.NewRequest(req))
		if err != nil {
			return "", err
		}
		id := res.Msg.GetSession().GetId()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, _ = c.CloseSession(ctx, connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: id}))
		})
		return id, nil
	}
	for range 2 {
		if _, err := open(a, 0); err != nil {
			t.Fatal(err)
		}
	}
	const named = "tenant has 2 open sessions on this agent, the limit per tenant (--max-sessions-per-tenant)"

	t.Run("connect", func(t *testing.T) {
		if _, err := open(a, 0); connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), named) {
			t.Errorf("team-a's third session: %v, want resource_exhausted: %s", err, named)
		}
		// A run under a new id would open a session: refused the same way.
		_, err := a.Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "bash", Code: "true", SessionId: "third"}))
		if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), named) {
			t.Errorf("team-a's run opening a third session: %v, want resource_exhausted: %s", err, named)
		}
	})
	t.Run("run", func(t *testing.T) {
		status, out := seedRun(t, edge, keyA, "bash", "true", "third-run")
		if status != http.StatusTooManyRequests || !strings.Contains(out.Error, named) {
			t.Errorf("/run opening team-a's third session: HTTP %d %+v, want 429: %s", status, out, named)
		}
	})
	t.Run("mcp", func(t *testing.T) {
		cs := keyedMCP(t, edge.URL()+"/mcp", keyA)
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "create_session", Arguments: map[string]any{"language": "bash"}})
		if err != nil || !res.IsError || !strings.Contains(testkit.ToolText(res), named) {
			t.Errorf("MCP create_session for team-a: %v %v, want a tool error: %s", testkit.ToolText(res), err, named)
		}
	})

	// The agent holds 3 sessions: team-b may have the last.
	if _, err := open(b, 2*time.Hour); connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "--max-session-idle-ttl") {
		t.Errorf("team-b's session asking for a 2h idle timeout: %v, want invalid_argument naming --max-session-idle-ttl", err)
	}
	if _, err := open(b, time.Hour); err != nil {
		t.Fatalf("team-b's session while team-a is at its limit: %v", err)
	}

	// GET /status: each tenant its own sessions, nobody the load.
	checkStatusPerTenant(t, edge, keyA, keyB)

	// Tokens of the same tenants: the same limit, the same sessions.
	p := sharedProvider(t)
	tokenA, tokenB := tenantToken(t, p, "org-a", allScopes...), tenantToken(t, p, "org-b", allScopes...)
	if _, err := open(edgev1connect.NewExecutionServiceClient(bearerClient(tokenA), edge.URL()), 0); connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), named) {
		t.Errorf("team-a's third session, with a token: %v, want resource_exhausted: %s", err, named)
	}
	checkStatusPerTenant(t, edge, tokenA, tokenB)
}

// checkStatusPerTenant checks GET /status through edge: team-a (keyA) sees its 2
// sessions, team-b (keyB) its 1, and neither the agent's load.
func checkStatusPerTenant(t *testing.T, edge *Process, keyA, keyB string) {
	for key, want := range map[string]int{keyA: 2, keyB: 1} {
		testkit.Eventually(t, 30*time.Second, func() error { // the control plane polls the agent
			code, _, body := seedCall(t, http.MethodGet, edge.URL()+"/status", key, "")
			var st struct {
				Status   string
				Sessions int
				Agents   []map[string]any
			}
			if err := json.Unmarshal(body, &st); err != nil || code != http.StatusOK {
				t.Fatalf("GET /status: HTTP %d %s: %v", code, body, err)
			}
			if st.Status == "ok" && st.Sessions == want && len(st.Agents) == 1 && st.Agents[0]["sessions"] == float64(want) {
				for _, load := range []string{"busy", "warm", "free"} {
					if _, ok := st.Agents[0][load]; ok {
						t.Errorf("/status %s shows the agent's %s sandboxes", body, load)
					}
				}
				return nil
			}
			return fmt.Errorf("/status %s, want status ok and the tenant's own %d sessions", body, want)
		})
	}
}

// TestAnonymousTenantIsReserved: an edge whose API keys name the tenant of
// keyless callers, "anonymous", exits at start-up saying the name is
// reserved, so that a key never reaches the sessions that keyless callers
// open through another edge of the cluster.
func TestAnonymousTenantIsReserved(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	keys := filepath.Join(t.TempDir(), "keys.json")
	if err := os.WriteFile(keys, []byte(`{"k-0123456789abcdef01": "anonymous"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "edge"), "--addr", "127.0.0.1:0", "--api-keys", keys)
	cmd.Env = append(withoutSecret(os.Environ()), "CODE_EXECUTION_HOST=http://127.0.0.1:1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("edge with a key naming anonymous: %v, want a non-zero exit\n%s", err, out)
	}
	if !strings.Contains(string(out), `"anonymous" is reserved`) {
		t.Errorf("the edge's message does not say the name is reserved:\n%s", out)
	}
}
