package e2e

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/testkit"
)

// API keys of TestSDKPoliciesThroughEveryDoor's tenants.
const (
	sdkKeyBob     = "k-sdk-bob-0123456789abcd"
	sdkKeyMallory = "k-sdk-mallory-0123456789"
	sdkKeyEve     = "k-sdk-eve-0123456789abcd"
)

// TestSDKPoliciesThroughEveryDoor runs the Rust and C SDKs' examples in a
// real edge's chain: tenantblock built with Rust denies mallory,
// tenantblock built with C denies eve, and redact built with C removes the
// AWS access key ids from bob's output, on every door.
func TestSDKPoliciesThroughEveryDoor(t *testing.T) {
	t.Parallel()
	s := shared(t)
	edge := startSDKPolicyEdge(t, s)

	const leak = "import sys\nprint('key=AKIA' + 'IOSFODNN7EXAMPLE')\nprint('AKIA' + 'IOSFODNN7EXAMPL2', file=sys.stderr)"
	const redacted = "key=[REDACTED aws-access-key-id]\n"
	denials := []struct{ key, policy string }{{sdkKeyMallory, "tenantblock-rust"}, {sdkKeyEve, "tenantblock-c"}}
	const reason = "tenant is suspended by the tenant policy"

	for _, pr := range protocols {
		t.Run(pr.name, func(t *testing.T) {
			t.Parallel()
			client := edgev1connect.NewExecutionServiceClient(httpClient, edge.URL(), pr.opts...)
			res, err := client.Execute(t.Context(), withKey(&edgev1.ExecuteRequest{Language: "python", Code: leak}, sdkKeyBob))
			if err != nil {
				t.Fatalf("bob: %v\n%s", err, edge.Logs())
			}
			if r := res.Msg.GetResult(); r.GetStdout() != redacted || r.GetStderr() != "[REDACTED aws-access-key-id]\n" {
				t.Errorf("bob's result %q %q, want the keys redacted by redact-c", r.GetStdout(), r.GetStderr())
			}
			for _, d := range denials {
				_, err := client.Execute(t.Context(), withKey(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"}, d.key))
				wantDenied(t, err, d.policy, reason)
			}
			// A stream is held back for the result policy, then redacted.
			st, err := client.ExecuteStream(t.Context(), withKey(&edgev1.ExecuteStreamRequest{Language: "python", Code: leak}, sdkKeyBob))
			if err != nil {
				t.Fatal(err)
			}
			var stdout string
			for st.Receive() {
				stdout += st.Msg().GetEvent().GetStdout()
			}
			if err := st.Err(); err != nil || stdout != redacted {
				t.Errorf("bob's stream %q, %v; want %q", stdout, err, redacted)
			}
			st, err = client.ExecuteStream(t.Context(), withKey(&edgev1.ExecuteStreamRequest{Language: "python", Code: "print(1)"}, sdkKeyEve))
			if err == nil {
				for st.Receive() {
				}
				err = st.Err()
			}
			wantDenied(t, err, "tenantblock-c", reason)
		})
	}

	t.Run("mcp", func(t *testing.T) {
		t.Parallel()
		res := callToolWithKey(t, edge.URL()+"/mcp", sdkKeyBob, "execute_code", map[string]any{"language": "python", "code": leak})
		if text := testkit.ToolText(res); res.IsError || strings.Contains(text, "AKIA") || !strings.Contains(text, "[REDACTED aws-access-key-id]") {
			t.Errorf("bob's MCP result isError=%v %q, want the keys redacted", res.IsError, text)
		}
		for _, d := range denials {
			res := callToolWithKey(t, edge.URL()+"/mcp", d.key, "execute_code", map[string]any{"language": "python", "code": "print(1)"})
			if text := testkit.ToolText(res); !res.IsError || !strings.Contains(text, "denied by policy "+d.policy) || !strings.Contains(text, reason) {
				t.Errorf("MCP result isError=%v %q, want a denial by %s", res.IsError, text, d.policy)
			}
		}
	})

	t.Run("post run", func(t *testing.T) {
		t.Parallel()
		if status, out := seedRun(t, edge, sdkKeyBob, "python", leak, ""); status != http.StatusOK ||
			!strings.Contains(out.Output, redacted) || strings.Contains(out.Output, "AKIA") {
			t.Errorf("bob's /run: HTTP %d %+v, want the keys redacted", status, out)
		}
		for _, d := range denials {
			status, out := seedRun(t, edge, d.key, "python", "print(1)", "")
			if status != http.StatusForbidden || !strings.Contains(out.Error, d.policy) || !strings.Contains(out.Error, reason) {
				t.Errorf("/run: HTTP %d %+v, want 403 naming %s and its reason", status, out, d.policy)
			}
		}
	})
}

// startSDKPolicyEdge builds the Rust and C SDKs' examples and starts an edge of s
// with tenantblock-rust (mallory), tenantblock-c (eve) and redact-c, stopped when
// the test ends.
func startSDKPolicyEdge(t *testing.T, s *Stack) *Process {
	rust, c := policytest.BuildSDK(t, "rust"), policytest.BuildSDK(t, "c")
	dir := t.TempDir()
	p := func(name, path, phase string, order int, config string) map[string]any {
		return map[string]any{"name": name, "path": path, "sha256": policytest.Digest(t, path),
			"phase": phase, "order": order, "config": config}
	}
	cfg := map[string]any{"policies": []map[string]any{
		p("tenantblock-rust", filepath.Join(rust, "tenantblock-rust.wasm"), "request", 5, "mallory"),
		p("tenantblock-c", filepath.Join(c, "tenantblock-c.wasm"), "request", 6, "eve"),
		p("redact-c", filepath.Join(c, "redact-c.wasm"), "result", 10, ""),
	}}
	return startEdgeWithPolicies(t, s, dir, cfg, map[string]string{sdkKeyBob: "bob", sdkKeyMallory: "mallory", sdkKeyEve: "eve"})
}
