package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/cluster"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit/launch"
)

// caller runs programs through one door. A worker of a measurement has a
// caller of its own (for MCP: its own session).
type caller interface {
	// call runs j once. A run that does not exit 0 or does not return
	// the artifact j names, and every error, is a *failure.
	call(ctx context.Context, j job) error
	close()
}

// target is where a measurement sends its runs: a door of an edge, or the
// agent directly.
type target struct {
	name string
	dial func(ctx context.Context) (caller, error)
	// cpu reads the CPU time used so far by the host and by the services
	// on the target's path; nil: not measured.
	cpu func() cpuUse
	// sandboxes reads the CPU time used so far by each sandbox of the
	// target's agent; nil: not measured.
	sandboxes func() map[string]time.Duration
	// quiet waits until the target's agent has no run, scrub or sandbox
	// start under way; nil: not waited for.
	quiet func()
}

// failure is a run that did not succeed, with the kind it is counted as.
type failure struct {
	kind string
	msg  string
}

func (f *failure) Error() string { return f.kind + ": " + f.msg }

// Kinds of failure that are not a Connect code.
const (
	kindPolicyUnavailable = "policy_unavailable" // a policy failed and the chain failed closed
	kindExit              = "exit_nonzero"       // the program ran and did not exit 0
	kindMCPTool           = "mcp_tool_error"     // an MCP result with isError and no code in its text
	kindMCPProtocol       = "mcp_jsonrpc"        // an MCP call that failed as a JSON-RPC call
	kindTransport         = "transport"          // no answer at all
	kindArtifact          = "artifact_missing"   // the run did not return the artifact it writes
)

// codeNames are the Connect codes' names, as they appear in messages.
var codeNames = func() []string {
	var s []string
	for c := connect.CodeCanceled; c <= connect.CodeUnauthenticated; c++ {
		s = append(s, c.String())
	}
	return s
}()

// kindOfText finds the kind of a failure in the text of an answer: a
// policy_unavailable denial first, then the name of a Connect code, else
// fallback.
func kindOfText(text, fallback string) string {
	if strings.Contains(text, kindPolicyUnavailable) {
		return kindPolicyUnavailable
	}
	for _, c := range codeNames {
		if strings.Contains(text, c) {
			return c
		}
	}
	return fallback
}

// classify returns the kind of err: a *failure's own, else a Connect
// code (policy_unavailable when the message says so), else transport.
func classify(err error) string {
	if err == nil {
		return ""
	}
	var f *failure
	if errors.As(err, &f) {
		return f.kind
	}
	if strings.Contains(err.Error(), kindPolicyUnavailable) {
		return kindPolicyUnavailable
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code().String()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return connect.CodeDeadlineExceeded.String()
	}
	return kindTransport
}

// authClient speaks HTTP/1.1 and h2c (gRPC needs HTTP/2, over cleartext
// here) and sends token as a bearer token.
func (b *bench) authClient(token string) *http.Client {
	return cluster.WithBearer(server.NewClient(), token)
}

func exitFailure(code int32, stderr string) error {
	if code == 0 {
		return nil
	}
	return &failure{kind: kindExit, msg: fmt.Sprintf("exit %d: %.200s", code, stderr)}
}

// resultFailure is the failure of a run that ended with res: it did not
// exit 0, or it did not return the artifact j names (whole and not empty).
func resultFailure(res *executionv1.Result, j job) error {
	if err := exitFailure(res.GetExitCode(), res.GetStderr()); err != nil || j.artifact == "" {
		return err
	}
	for _, a := range res.GetArtifacts() {
		if a.GetName() == j.artifact && len(a.GetContent()) > 0 && uint64(len(a.GetContent())) == a.GetSize() {
			return nil
		}
	}
	return &failure{kind: kindArtifact, msg: fmt.Sprintf("no artifact %q among %d", j.artifact, len(res.GetArtifacts()))}
}

// agentTarget is the agent's own API, with the cluster secret.
func (b *bench) agentTarget() target {
	c := agentv1connect.NewAgentServiceClient(b.authClient(b.secret), b.agent.URL())
	return target{name: "agent", dial: func(context.Context) (caller, error) { return agentCaller{c}, nil }, cpu: b.cpuMeter(nil)}
}

type agentCaller struct {
	c agentv1connect.AgentServiceClient
}

func (a agentCaller) call(ctx context.Context, j job) error {
	res, err := a.c.Execute(ctx, connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{Language: j.language, Code: j.code}}))
	if err != nil {
		return err
	}
	return resultFailure(res.Msg.GetResult(), j)
}

func (agentCaller) close() {}

// edgeTargets are the five doors of edge.
func (b *bench) edgeTargets(edge *launch.Process) []target {
	base := edge.URL()
	hc := b.authClient(b.key)
	rpc := func(name string, opts ...connect.ClientOption) target {
		c := edgev1connect.NewExecutionServiceClient(hc, base, opts...)
		return target{name: name, dial: func(context.Context) (caller, error) { return edgeCaller{c}, nil }}
	}
	ts := []target{
		rpc("connect-json", connect.WithProtoJSON()),
		rpc("grpc", connect.WithGRPC()),
		rpc("grpc-web", connect.WithGRPCWeb()),
		{name: "mcp", dial: func(ctx context.Context) (caller, error) {
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "stackbench", Version: "1"}, nil).
				Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: hc}, nil)
			if err != nil {
				return nil, fmt.Errorf("connect MCP: %w", err)
			}
			return mcpCaller{cs}, nil
		}},
		{name: "run", dial: func(context.Context) (caller, error) { return runCaller{hc, base + "/run"}, nil }},
	}
	for i := range ts {
		ts[i].cpu = b.cpuMeter(edge)
	}
	return ts
}

type edgeCaller struct {
	c edgev1connect.ExecutionServiceClient
}

func (e edgeCaller) call(ctx context.Context, j job) error {
	res, err := e.c.Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: j.language, Code: j.code}))
	if err != nil {
		return err
	}
	return resultFailure(res.Msg.GetResult(), j)
}

func (edgeCaller) close() {}

// mcpCaller calls the execute_code tool in its own MCP session.
type mcpCaller struct{ cs *mcp.ClientSession }

func (m mcpCaller) call(ctx context.Context, j job) error {
	res, err := m.cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"language": j.language, "code": j.code}})
	if err != nil {
		return &failure{kind: kindOfText(err.Error(), kindMCPProtocol), msg: err.Error()}
	}
	if res.IsError {
		var text strings.Builder
		for _, c := range res.Content {
			if t, ok := c.(*mcp.TextContent); ok {
				text.WriteString(t.Text)
			}
		}
		return &failure{kind: kindOfText(text.String(), kindMCPTool), msg: text.String()}
	}
	var out struct {
		Stderr   string `json:"stderr"`
		ExitCode int32  `json:"exit_code"`
	}
	raw, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(raw, &out); err != nil {
		return &failure{kind: kindMCPTool, msg: fmt.Sprintf("structured content %.200s: %v", raw, err)}
	}
	return exitFailure(out.ExitCode, out.Stderr)
}

func (m mcpCaller) close() { m.cs.Close() }

// runCaller posts to the original's POST /run.
type runCaller struct {
	hc  *http.Client
	url string
}

func (r runCaller) call(ctx context.Context, j job) error {
	body, _ := json.Marshal(map[string]string{"language": j.language, "code": j.code})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := r.hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 4<<20))
	if err != nil {
		return err
	}
	return runAnswer(res.StatusCode, b)
}

func (runCaller) close() {}

// runAnswer classifies an answer of POST /run: a status other than 200
// is counted as http_STATUS (policy_unavailable when its error says so),
// a 200 whose program did not exit 0 as exit_nonzero.
func runAnswer(status int, body []byte) error {
	var out struct {
		Error    string `json:"error"`
		ExitCode int32  `json:"exitCode"`
	}
	decodeErr := json.Unmarshal(body, &out)
	if status != http.StatusOK {
		kind := fmt.Sprintf("http_%d", status)
		if strings.Contains(string(body), kindPolicyUnavailable) {
			kind = kindPolicyUnavailable
		}
		return &failure{kind: kind, msg: fmt.Sprintf("%.200s", body)}
	}
	if decodeErr != nil {
		return &failure{kind: kindTransport, msg: fmt.Sprintf("answer %.200q: %v", body, decodeErr)}
	}
	return exitFailure(out.ExitCode, out.Error)
}
