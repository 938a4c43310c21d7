package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
)

// logRecord is one JSON log line, decoded.
type logRecord map[string]any

// records returns p's JSON log lines so far.
func records(p *Process) []logRecord {
	var out []logRecord
	for _, l := range p.LogLines() {
		var r logRecord
		if json.Unmarshal([]byte(l), &r) == nil {
			out = append(out, r)
		}
	}
	return out
}

// waitLog waits until p has logged a line with message msg and every
// key-value in want, and returns it.
func waitLog(t *testing.T, p *Process, msg string, want map[string]any) logRecord {
	t.Helper()
	var found logRecord
	testkit.Eventually(t, 10*time.Second, func() error {
	next:
		for _, r := range records(p) {
			if r["msg"] != msg {
				continue
			}
			for k, v := range want {
				if r[k] != v {
					continue next
				}
			}
			found = r
			return nil
		}
		return fmt.Errorf("%s logged no %q line with %v\n%s", p.Name, msg, want, p.Logs())
	})
	return found
}

// headerTransport sends a header with every request.
type headerTransport struct {
	key, value string
	base       http.RoundTripper
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.key, h.value)
	return h.base.RoundTrip(r)
}

// TestRequestIDEverywhere sends a request id through every door and finds
// it in the response header, in the result, and on each service's line
// about the execution.
func TestRequestIDEverywhere(t *testing.T) {
	t.Parallel()
	rc := &requestIDCase{s: shared(t), stamp: time.Now().UnixNano()}
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) { rc.protocol(t, p.name, p.opts) })
	}
	t.Run("mcp", rc.mcp)
	t.Run("run", rc.run)
	t.Run("invalid id replaced", rc.invalidIdReplaced)
}

// requestIDCase is TestRequestIDEverywhere's stack and the stamp that makes
// its request ids its own.
type requestIDCase struct {
	s     *Stack
	stamp int64
}

// checkLogs checks that the edge, the control plane and the agent each log
// the execution of request id, which came in through door.
func (rc *requestIDCase) checkLogs(t *testing.T, id, door string) {
	t.Helper()
	edge := waitLog(t, rc.s.Edge, "execution", map[string]any{"request_id": id, "door": door})
	for _, k := range []string{"tenant", "language", "agent", "outcome", "elapsed"} {
		if _, ok := edge[k]; !ok {
			t.Errorf("edge's execution line has no %s: %v", k, edge)
		}
	}
	if edge["outcome"] != "ok" || edge["language"] != "python" || edge["agent"] != rc.s.AgentName {
		t.Errorf("edge's execution line: %v, want outcome ok, language python, agent %s", edge, rc.s.AgentName)
	}
	waitLog(t, rc.s.ControlPlane, "execution", map[string]any{"request_id": id, "outcome": "ok", "agent": rc.s.AgentName})
	waitLog(t, rc.s.Agent, "execution", map[string]any{"request_id": id, "outcome": "ok", "agent": rc.s.AgentName, "language": "python"})
}

// protocol runs a call and a stream over the protocol of opts, each with a request id of its
// own, and checks that each answer and log line carries it.
func (rc *requestIDCase) protocol(t *testing.T, name string, opts []connect.ClientOption) {
	t.Parallel()
	c := edgev1connect.NewExecutionServiceClient(httpClient, rc.s.Edge.URL(), opts...)
	id := fmt.Sprintf("e2e-%s-unary.%d", name, rc.stamp)
	req := connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"})
	req.Header().Set(server.RequestIDHeader, id)
	res, err := c.Execute(t.Context(), req)
	if err != nil {
		t.Fatalf("execute: %v\n%s", err, rc.s.Logs())
	}
	if got := res.Header().Get(server.RequestIDHeader); got != id {
		t.Errorf("response header %s = %q, want %q", server.RequestIDHeader, got, id)
	}
	if got := res.Msg.GetResult().GetRequestId(); got != id {
		t.Errorf("result request_id = %q, want %q", got, id)
	}
	rc.checkLogs(t, id, name)

	id = fmt.Sprintf("e2e-%s-stream.%d", name, rc.stamp)
	sreq := connect.NewRequest(&edgev1.ExecuteStreamRequest{Language: "python", Code: "print(2)"})
	sreq.Header().Set(server.RequestIDHeader, id)
	st, err := c.ExecuteStream(t.Context(), sreq)
	if err != nil {
		t.Fatal(err)
	}
	var got string
	for st.Receive() {
		if r := st.Msg().GetEvent().GetResult(); r != nil {
			got = r.GetRequestId()
		}
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if h := st.ResponseHeader().Get(server.RequestIDHeader); h != id {
		t.Errorf("stream response header %s = %q, want %q", server.RequestIDHeader, h, id)
	}
	if got != id {
		t.Errorf("stream result request_id = %q, want %q", got, id)
	}
	rc.checkLogs(t, id, name)
}

func (rc *requestIDCase) mcp(t *testing.T) {
	t.Parallel()
	id := fmt.Sprintf("e2e-mcp.%d", rc.stamp)
	hc := &http.Client{Transport: headerTransport{key: server.RequestIDHeader, value: id, base: http.DefaultTransport}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil).
		Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: rc.s.Edge.URL() + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"code": "print(3)", "language": "python"}})
	if err != nil || res.IsError {
		t.Fatalf("execute_code: %v %v", err, testkit.ToolText(res))
	}
	if got := res.Meta["codemode/request_id"]; got != id {
		t.Errorf("_meta codemode/request_id = %v, want %q", got, id)
	}
	rc.checkLogs(t, id, "mcp")
}

func (rc *requestIDCase) run(t *testing.T) {
	t.Parallel()
	id := fmt.Sprintf("e2e-run.%d", rc.stamp)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, rc.s.Edge.URL()+"/run", strings.NewReader(`{"code":"print(4)","language":"python"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(server.RequestIDHeader, id)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get(server.RequestIDHeader) != id {
		t.Fatalf("HTTP %d, %s %q, want 200 and %q", res.StatusCode, server.RequestIDHeader, res.Header.Get(server.RequestIDHeader), id)
	}
	rc.checkLogs(t, id, "http")
}

func (rc *requestIDCase) invalidIdReplaced(t *testing.T) {
	t.Parallel()
	c := edgev1connect.NewExecutionServiceClient(httpClient, rc.s.Edge.URL())
	for _, bad := range []string{"has space", strings.Repeat("x", 65), "semi;colon", "new\u00e9"} {
		req := connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(5)"})
		req.Header().Set(server.RequestIDHeader, bad)
		res, err := c.Execute(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		got := res.Header().Get(server.RequestIDHeader)
		if got == "" || got == bad || res.Msg.GetResult().GetRequestId() != got {
			t.Errorf("sent %q: header %q, result %q; want a new id in both", bad, got, res.Msg.GetResult().GetRequestId())
		}
	}
}
