package telemetry

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

func TestOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		res  *executionv1.Result
		err  error
		want string
	}{
		{"exit 0", &executionv1.Result{}, nil, OutcomeOK},
		{"exit 3", &executionv1.Result{ExitCode: 3}, nil, OutcomeExit},
		{"timed out", &executionv1.Result{ExitCode: 137, TimedOut: true}, nil, OutcomeTimedOut},
		{"oom", &executionv1.Result{ExitCode: 137, OomKilled: true}, nil, OutcomeOOM},
		{"refused", nil, connect.NewError(connect.CodeResourceExhausted, errors.New("busy")), "resource_exhausted"},
		{"plain error", nil, errors.New("boom"), "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Outcome(tc.res, tc.err); got != tc.want {
				t.Errorf("Outcome = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestExecutionLog(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	e := Execution{
		RequestID: "r1", Tenant: "acme", Door: "grpc", Language: "python",
		Result:  &executionv1.Result{Agent: "a1", ExitCode: 2, Duration: durationpb.New(time.Millisecond)},
		Elapsed: 3 * time.Millisecond,
	}
	e.Log(t.Context(), log)
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"msg": "execution", "level": "INFO", "request_id": "r1", "tenant": "acme", "door": "grpc",
		"language": "python", "agent": "a1", "outcome": "exit", "exit_code": float64(2)}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v (line %s)", k, got[k], v, buf.Bytes())
		}
	}
	for _, k := range []string{"duration", "elapsed"} {
		if _, ok := got[k]; !ok {
			t.Errorf("no %s in %s", k, buf.Bytes())
		}
	}
}

// TestMetricsLoopbackOnly holds SECURITY.md's claim that /metrics, served
// without authentication, is never served off loopback.
func TestMetricsLoopbackOnly(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"0.0.0.0:0", "[::]:0", "192.0.2.1:0", "example.com:0"} {
		if ln, err := ListenMetrics(t.Context(), addr); err == nil {
			ln.Close()
			t.Errorf("ListenMetrics(%q) listened; want a refusal", addr)
		}
	}
	ln, err := ListenMetrics(t.Context(), ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); host != "127.0.0.1" {
		t.Errorf("a bare port listened on %s, want 127.0.0.1", ln.Addr())
	}
}
