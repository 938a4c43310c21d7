// Package mcpserver serves codemode over the Model Context Protocol
// (streamable HTTP) as a thin adapter over the edge's execution.Service.
//
// Two endpoints: one with the execute_code tool, and one without any tool
// that runs code, for clients that must not be able to.
package mcpserver

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/edge/internal/execution"
	"github.com/codemode-go/codemode/edge/internal/tenant"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
)

// ExecuteInput is execute_code's input.
type ExecuteInput struct {
	Code           string  `json:"code" jsonschema:"source code to run"`
	Language       string  `json:"language,omitempty" jsonschema:"python (default), bash, sh or javascript"`
	SessionID      string  `json:"session_id,omitempty" jsonschema:"run in this session: files, the working directory and (for python and bash) variables and functions persist between calls with the same id; omit for a fresh sandbox"`
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty" jsonschema:"wall-clock limit in seconds, at most 300 (default 30)"`
	Stdin          string  `json:"stdin,omitempty" jsonschema:"text given to the program's standard input"`
}

// ExecuteOutput is execute_code's structured result.
type ExecuteOutput struct {
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	ExitCode   int32  `json:"exit_code"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	Truncated  bool   `json:"truncated,omitempty"`
	OOMKilled  bool   `json:"oom_killed,omitempty"`
	DurationMS int64  `json:"duration_ms"`
	SessionID  string `json:"session_id,omitempty"`
}

// LanguagesOutput is list_languages's result.
type LanguagesOutput struct {
	Languages []Language `json:"languages"`
}

// Language is one runnable language.
type Language struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
}

// Config configures the MCP endpoints.
type Config struct {
	Service *execution.Service
	Tenants *tenant.Resolver
	Logger  *slog.Logger
	// Version is reported to clients.
	Version string
}

// Handlers returns the handler for the endpoint with execute_code and the
// one without it.
func Handlers(cfg Config) (withCode, withoutCode http.Handler) {
	a := &adapter{svc: cfg.Service, tenants: cfg.Tenants}
	impl := &mcp.Implementation{Name: "codemode", Title: "codemode", Version: cfg.Version}

	full := mcp.NewServer(impl, &mcp.ServerOptions{
		Logger:       cfg.Logger,
		Instructions: "Runs code in isolated gVisor sandboxes with no network. Use execute_code; pass session_id to keep state between calls.",
	})
	mcp.AddTool(full, &mcp.Tool{
		Name:        "execute_code",
		Title:       "Execute code",
		Description: "Run code in a fresh, isolated sandbox (no network) and return its stdout, stderr and exit code. Languages: python, bash, sh, javascript.",
	}, a.executeCode)
	mcp.AddTool(full, languagesTool(), a.listLanguages)
	a.addFileTools(full)

	bare := mcp.NewServer(impl, &mcp.ServerOptions{Logger: cfg.Logger})
	mcp.AddTool(bare, languagesTool(), a.listLanguages)

	opts := &mcp.StreamableHTTPOptions{Logger: cfg.Logger, SessionTimeout: 30 * time.Minute}
	withCode = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return full }, opts)
	withoutCode = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return bare }, opts)
	return withCode, withoutCode
}

func languagesTool() *mcp.Tool {
	return &mcp.Tool{
		Name:        "list_languages",
		Title:       "List languages",
		Description: "List the languages code can be run in, with interpreter versions.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}
}

type adapter struct {
	svc     *execution.Service
	tenants *tenant.Resolver
}

// caller returns who makes req. The edge resolved the tenant from the
// HTTP request's key before MCP read its body; the handlers resolve it again
// from the header that the SDK hands over, which is the same.
func (a *adapter) caller(ctx context.Context, req *mcp.CallToolRequest) (execution.Caller, error) {
	var h http.Header
	if req.Extra != nil {
		h = req.Extra.Header
	}
	t, err := a.tenants.Of(ctx, h)
	if err != nil {
		return execution.Caller{}, err
	}
	c := execution.Caller{Tenant: t, Door: "mcp", RequestID: h.Get(server.RequestIDHeader)}
	if c.RequestID == "" {
		c.RequestID = execution.NewRequestID()
	}
	return c, nil
}

// failed returns err for a tool result with isError, naming the request id
// so that a user can report it.
func failed(c execution.Caller, err error) error {
	if strings.Contains(err.Error(), c.RequestID) {
		return err
	}
	return fmt.Errorf("%w (request id %s)", err, c.RequestID)
}

// withRequestID records the request id in a result's _meta.
func withRequestID(res *mcp.CallToolResult, c execution.Caller) *mcp.CallToolResult {
	res.Meta = mcp.Meta{"codemode/request_id": c.RequestID}
	return res
}

func (a *adapter) executeCode(ctx context.Context, req *mcp.CallToolRequest, in ExecuteInput) (*mcp.CallToolResult, ExecuteOutput, error) {
	c, err := a.caller(ctx, req)
	if err != nil {
		return nil, ExecuteOutput{}, err
	}
	lang := strings.ToLower(strings.TrimSpace(in.Language))
	if lang == "" {
		lang = "python"
	}
	ex := &executionv1.Execution{Language: lang, Code: in.Code, SessionId: in.SessionID, Stdin: []byte(in.Stdin)}
	if in.TimeoutSeconds != 0 {
		ex.Timeout = durationpb.New(time.Duration(in.TimeoutSeconds * float64(time.Second)))
	}
	res, err := a.svc.Execute(ctx, execution.Call{Execution: ex, Tenant: c.Tenant, Door: c.Door, RequestID: c.RequestID})
	if err != nil {
		// Returned as a tool result with isError, so the model can read it.
		return nil, ExecuteOutput{}, failed(c, err)
	}
	out := ExecuteOutput{
		Stdout: res.GetStdout(), Stderr: res.GetStderr(), ExitCode: res.GetExitCode(),
		TimedOut: res.GetTimedOut(), Truncated: res.GetTruncated(), OOMKilled: res.GetOomKilled(),
		DurationMS: res.GetDuration().AsDuration().Milliseconds(), SessionID: res.GetSessionId(),
	}
	return withRequestID(&mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: Summary(res)}}}, c), out, nil
}

// Summary renders a result as text for a model to read: stdout, then stderr,
// then how the program ended when it did not simply exit 0.
func Summary(res *executionv1.Result) string {
	var b strings.Builder
	b.WriteString(res.GetStdout())
	if s := res.GetStderr(); s != "" {
		if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
			b.WriteByte('\n')
		}
		b.WriteString("[stderr]\n")
		b.WriteString(s)
	}
	var notes []string
	switch {
	case res.GetTimedOut():
		notes = append(notes, fmt.Sprintf("timed out after %s and was killed", res.GetDuration().AsDuration().Round(time.Millisecond)))
	case res.GetOomKilled():
		notes = append(notes, "killed: out of memory")
	case res.GetExitCode() != 0:
		notes = append(notes, fmt.Sprintf("exit code %d", res.GetExitCode()))
	}
	if res.GetTruncated() {
		notes = append(notes, "output truncated")
	}
	if len(notes) > 0 {
		if b.Len() > 0 && !strings.HasSuffix(b.String(), "\n") {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "[%s]", strings.Join(notes, "; "))
	}
	if b.Len() == 0 {
		b.WriteString("[no output; exit code 0]")
	}
	return b.String()
}

func (a *adapter) listLanguages(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, LanguagesOutput, error) {
	c, err := a.caller(ctx, req)
	if err != nil {
		return nil, LanguagesOutput{}, err
	}
	langs, err := a.svc.Languages(ctx, c)
	if err != nil {
		return nil, LanguagesOutput{}, failed(c, err)
	}
	out := LanguagesOutput{Languages: []Language{}}
	var names []string
	for _, l := range langs {
		out.Languages = append(out.Languages, Language{Name: l.GetName(), Version: l.GetVersion()})
		names = append(names, strings.TrimSpace(l.GetName()+" "+l.GetVersion()))
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Join(names, "\n")}}}, out, nil
}
