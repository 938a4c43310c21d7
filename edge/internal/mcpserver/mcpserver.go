// Package mcpserver serves codemode over the Model Context Protocol as a
// thin adapter over a Backend: the edge's own execution.Service for MCP
// over streamable HTTP, or an edge's Connect API for MCP over stdio.
//
// Two tool sets: one with execute_code and the session and file tools, and
// one without any tool that runs code, for clients that must not be able
// to. The second offers the declared APIs' tools (Config.APIs), each one
// HTTP request the edge makes; the first tells code where the same APIs
// are.
package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/edge/internal/tenant"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/apicatalog"
	"github.com/codemode-go/codemode/internal/egressrule"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/telemetry"
)

// ExecuteInput is execute_code's input.
type ExecuteInput struct {
	Code           string  `json:"code" jsonschema:"source code to run"`
	Language       string  `json:"language,omitempty" jsonschema:"language of code; the agents' default (the schema's default) when omitted"`
	SessionID      string  `json:"session_id,omitempty" jsonschema:"run in this session (from create_session, or any new id to open one): files in /workspace, the working directory and, for python and bash, variables and functions persist between calls; omit for a fresh sandbox used once"`
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty" jsonschema:"wall-clock limit in seconds; the agents' default when omitted (the tool description says the default and the most allowed)"`
	Stdin          string  `json:"stdin,omitempty" jsonschema:"text given to the program's standard input"`
}

// ExecuteOutput is execute_code's structured result.
type ExecuteOutput struct {
	Stdout     string `json:"stdout" jsonschema:"standard output"`
	Stderr     string `json:"stderr" jsonschema:"standard error"`
	ExitCode   int32  `json:"exit_code" jsonschema:"the program's exit code; -1 when it was killed"`
	TimedOut   bool   `json:"timed_out,omitempty" jsonschema:"the run hit its time limit and was killed"`
	Truncated  bool   `json:"truncated,omitempty" jsonschema:"output went over the limit and was cut"`
	OOMKilled  bool   `json:"oom_killed,omitempty" jsonschema:"the run went over its memory limit and was killed"`
	DurationMS int64  `json:"duration_ms" jsonschema:"wall-clock time of the run in milliseconds"`
	SessionID  string `json:"session_id,omitempty" jsonschema:"the session the run used"`
	// The artifacts' contents come as content items of the result (images
	// as image content, other files as embedded resources), not here.
	Artifacts          []Artifact `json:"artifacts,omitempty" jsonschema:"files the run left in /workspace/outputs (new or changed), sent as image or resource content items"`
	ArtifactsTruncated bool       `json:"artifacts_truncated,omitempty" jsonschema:"some files of /workspace/outputs were left out for the size limits"`
	Egress             *Egress    `json:"egress,omitempty" jsonschema:"what the run reached outside its sandbox through the egress proxy, when it tried"`
}

// Egress is what a run did through its egress.
type Egress struct {
	Connections   uint32 `json:"connections" jsonschema:"connections opened"`
	Refused       uint32 `json:"refused,omitempty" jsonschema:"connections refused: not allowed, a limit, or unreachable"`
	BytesSent     uint64 `json:"bytes_sent"`
	BytesReceived uint64 `json:"bytes_received"`
	// The first refusals, with the reason the proxy gave.
	Refusals     []string `json:"refusals,omitempty" jsonschema:"the first refusals: host:port and why"`
	LimitReached string   `json:"limit_reached,omitempty" jsonschema:"a limit the run reached (connections, bytes, connection_time); connections past it were refused or cut"`
}

// egressOf describes a result's egress report; nil if there is none.
func egressOf(r *executionv1.EgressReport) *Egress {
	if r == nil {
		return nil
	}
	e := &Egress{Connections: r.GetConnections(), Refused: r.GetRefused(), BytesSent: r.GetBytesSent(), BytesReceived: r.GetBytesReceived()}
	for _, f := range r.GetRefusals() {
		e.Refusals = append(e.Refusals, fmt.Sprintf("%s: %s", net.JoinHostPort(f.GetHost(), fmt.Sprint(f.GetPort())), f.GetReason()))
	}
	if l := r.GetLimitReached(); l != executionv1.EgressLimit_EGRESS_LIMIT_UNSPECIFIED {
		e.LimitReached = strings.ToLower(strings.TrimPrefix(l.String(), "EGRESS_LIMIT_"))
	}
	return e
}

// Artifact describes one file a run left in /workspace/outputs.
type Artifact struct {
	Name      string `json:"name" jsonschema:"path relative to /workspace/outputs"`
	MediaType string `json:"media_type" jsonschema:"media type, e.g. image/png"`
	Size      uint64 `json:"size" jsonschema:"size in bytes"`
	URI       string `json:"uri" jsonschema:"the artifact as a resource, for resources/read while the edge keeps it"`
}

// SessionInput is create_session's input.
type SessionInput struct {
	Language string `json:"language,omitempty" jsonschema:"language the session runs; the agents' default (the schema's default) when omitted"`
}

// SessionOutput is create_session's structured result.
type SessionOutput struct {
	SessionID  string `json:"session_id" jsonschema:"pass it as session_id to the other tools"`
	Language   string `json:"language"`
	ExpireTime string `json:"expire_time,omitempty" jsonschema:"when the session closes if no run comes before (RFC 3339); each run pushes it back"`
}

// CloseSessionInput is close_session's input.
type CloseSessionInput struct {
	SessionID string `json:"session_id" jsonschema:"the session to close"`
}

// CloseSessionOutput is close_session's structured result.
type CloseSessionOutput struct {
	SessionID string `json:"session_id" jsonschema:"the session that was closed"`
	Closed    bool   `json:"closed" jsonschema:"always true: a failure is an error result"`
}

// LanguagesOutput is list_languages's result.
type LanguagesOutput struct {
	Languages []Language `json:"languages"`
}

// Language is one runnable language.
type Language struct {
	Name         string   `json:"name"`
	Version      string   `json:"version,omitempty"`
	Aliases      []string `json:"aliases,omitempty"`
	Compiled     bool     `json:"compiled,omitempty"`
	SessionState string   `json:"session_state,omitempty" jsonschema:"what a session keeps between runs: interpreter, shell or files"`
}

// Config configures the MCP servers.
type Config struct {
	// Open returns the Backend of each request.
	Open   Opener
	Logger *slog.Logger
	// Version is reported to clients.
	Version string
	// ProgressInterval bounds how often a run's output goes to the client as
	// progress notifications; zero means DefaultProgressInterval.
	ProgressInterval time.Duration
	// Heartbeat is how long a run that prints nothing goes without a
	// progress notification; zero means DefaultHeartbeat.
	Heartbeat time.Duration
	// APIs are the declared APIs: their tools are offered without code
	// execution (called through Backend.CallAPI), and execute_code's
	// description names them. Nil: none.
	APIs *apicatalog.Catalog
	// Tracing gives each tool call a span, a child of the HTTP request's
	// (see telemetry.Tracing.Handler); nil: none.
	Tracing *telemetry.Tracing
	// Egress is what the tenants' runs may reach outside their sandboxes:
	// execute_code's description says there is no network when it allows
	// nothing, and names only the declared APIs some tenant's egress
	// allows. Nil: nothing.
	Egress *tenant.EgressConfig
	// Retention bounds what the resources of runs keep (see Retention);
	// zero fields take DefaultRetention's.
	Retention Retention
	// Metrics count tool calls by door, tool and outcome; nil: none.
	Metrics *telemetry.Metrics
}

const (
	// DefaultProgressInterval is the default Config.ProgressInterval.
	DefaultProgressInterval = 250 * time.Millisecond
	// DefaultHeartbeat is the default Config.Heartbeat: well inside the 60 s
	// request timeout of the SDKs' clients, which progress resets.
	DefaultHeartbeat = 15 * time.Second
)

// Servers builds the MCP servers of one client connection.
type Servers struct {
	cfg     Config
	langs   languageCache
	network network
	runs    *runStore

	mu    sync.Mutex
	built [2]builtServer // by tool set: [0] without execute_code, [1] with it
}

// builtServer is a server and the languages its tools were last made with.
type builtServer struct {
	langs *edgev1.ListLanguagesResponse
	srv   *mcp.Server
}

// New returns Servers for cfg.
func New(cfg Config) *Servers {
	if cfg.ProgressInterval <= 0 {
		cfg.ProgressInterval = DefaultProgressInterval
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	// The SDK logs session ids, which let whoever holds one act in that
	// session: it gets a logger that writes their hashes instead.
	cfg.Logger = slog.New(hashSessionIDs{cfg.Logger.Handler()})
	return &Servers{cfg: cfg, langs: languageCache{ttl: time.Minute}, network: networkOf(cfg.Egress, cfg.APIs),
		runs: newRunStore(cfg.Retention.withDefaults())}
}

// Server returns an MCP server for one client whose requests carry header
// h (nil on stdio). withCode selects the tool set with execute_code.
func (s *Servers) Server(ctx context.Context, h http.Header, withCode bool) *mcp.Server {
	srv := s.newServer(withCode)
	s.addTools(srv, s.languages(ctx, h), withCode)
	return srv
}

// languages returns what the agents run, asking with the credentials of
// header h when the cache has no fresh answer.
func (s *Servers) languages(ctx context.Context, h http.Header) *edgev1.ListLanguagesResponse {
	return s.langs.get(ctx, func(ctx context.Context) (*edgev1.ListLanguagesResponse, error) {
		b, _, err := s.cfg.Open(ctx, h)
		if err != nil {
			return nil, err
		}
		return b.Languages(ctx)
	})
}

// newServer makes a server of one tool set, with no tools yet. Its
// instructions say nothing that depends on the agents' languages: they go
// to a client once, when its session begins, while the tools follow the
// languages (see forRequest).
func (s *Servers) newServer(withCode bool) *mcp.Server {
	impl := &mcp.Implementation{Name: "codemode", Title: "codemode", Version: s.cfg.Version}
	opts := &mcp.ServerOptions{Logger: s.cfg.Logger, GetSessionID: newSessionID}
	if withCode {
		opts.Instructions = "Runs code in isolated sandboxes. " + s.network.sandbox +
			" execute_code's description says the languages and limits. Use execute_code to run code; create_session for state that lasts across calls." +
			" The files a run leaves in /workspace/outputs, and the files of your sessions, are resources (resources/read)."
	}
	srv := mcp.NewServer(impl, opts)
	door := "mcp-no-code-execute"
	if withCode {
		door = "mcp"
	}
	srv.AddReceivingMiddleware(countToolCalls(s.cfg.Metrics, door))
	if s.cfg.Tracing.Enabled() {
		srv.AddReceivingMiddleware(traceToolCalls(s.cfg.Tracing))
	}
	if withCode {
		s.addResources(srv)
	}
	return srv
}

// addTools adds the tools of one tool set, whose descriptions say langs,
// to srv, replacing those of the same names: the SDK then tells srv's
// sessions that the list changed (notifications/tools/list_changed).
func (s *Servers) addTools(srv *mcp.Server, langs *edgev1.ListLanguagesResponse, withCode bool) {
	s.addToolsOpening(srv, langs, withCode, s.cfg.Open)
}

// addToolsOpening is addTools with the tools opening their Backend with
// open.
func (s *Servers) addToolsOpening(srv *mcp.Server, langs *edgev1.ListLanguagesResponse, withCode bool, open Opener) {
	t := &tools{open: open, progressEvery: s.cfg.ProgressInterval, heartbeat: s.cfg.Heartbeat, runs: s.runs, network: s.network}
	mcp.AddTool(srv, languagesTool(), t.listLanguages)
	if withCode {
		t.addCodeTools(srv, langs)
		t.addFileTools(srv)
	} else {
		t.addAPITools(srv, s.cfg.APIs)
	}
}

// forRequest is the server for HTTP request r. The streamable HTTP handler
// asks for one on every request, not only for a new session (it reads the
// protocol versions the server speaks), and adding the tools resolves the
// schemas of every tool: a millisecond of CPU and a megabyte of garbage.
// So one server of each tool set serves every session, and its tools are
// made again only when a new session comes and the agents' languages have
// changed since: then every session of the server, old ones too, is told
// that the list changed and lists the new tools. A request of an existing
// session does not ask for the languages at all.
func (s *Servers) forRequest(r *http.Request, withCode bool) *mcp.Server {
	i := 0
	if withCode {
		i = 1
	}
	if r.Header.Get(sessionIDHeader) != "" {
		s.mu.Lock()
		srv := s.built[i].srv
		s.mu.Unlock()
		if srv != nil {
			return srv
		}
	}
	langs := s.languages(r.Context(), r.Header)
	s.mu.Lock()
	defer s.mu.Unlock()
	b := &s.built[i]
	if b.srv == nil {
		b.srv = s.newServer(withCode)
	} else if proto.Equal(b.langs, langs) {
		return b.srv
	}
	s.addTools(b.srv, langs, withCode)
	b.langs = langs
	return b.srv
}

// Handlers returns the streamable HTTP handlers of the endpoint with
// execute_code and of the one without it, wrapped so that a session serves
// only whoever opened it (see bindSessions) and protocol errors are
// answered as JSON-RPC errors (see protocol).
//
// They do not check the Host header: the edge's server checks it on every
// door before a request gets here (see server.Browsers), against the host
// names it is told to answer to. The SDK's own check knows only loopback
// names, and would refuse on /mcp alone a name the edge answers to behind
// a proxy on the same host.
func (s *Servers) Handlers() (withCode, withoutCode http.Handler) {
	opts := &mcp.StreamableHTTPOptions{Logger: s.cfg.Logger, SessionTimeout: 30 * time.Minute, DisableLocalhostProtection: true}
	withCode = mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server { return s.forRequest(r, true) }, opts)
	withoutCode = mcp.NewStreamableHTTPHandler(func(r *http.Request) *mcp.Server { return s.forRequest(r, false) }, opts)
	return protocol(bindSessions(withCode)), protocol(bindSessions(withoutCode))
}

// network is what a deployment's runs may reach, as the descriptions say
// it: the union of every tenant's egress, since one description serves
// every tenant.
type network struct {
	// sandbox is the sentence on the network.
	sandbox string
	// apis is the text on the declared APIs code may reach; empty when
	// none is declared or no tenant's egress allows one.
	apis string
}

// networkOf describes egress and the declared APIs of c.
func networkOf(egress *tenant.EgressConfig, c *apicatalog.Catalog) network {
	var rules []egressrule.Rule
	for _, e := range egress.All() {
		for _, r := range e.GetAllow() {
			if p, err := egressrule.Parse(r); err == nil {
				rules = append(rules, p)
			}
		}
	}
	if len(rules) == 0 {
		return network{sandbox: "There is no network: no download, package install or outside service works."}
	}
	var reachable []*apicatalog.API
	for _, a := range c.APIs() {
		if slices.ContainsFunc(rules, func(r egressrule.Rule) bool { return r.MatchHost(a.Host(), egressrule.DefaultHTTPPort) }) {
			reachable = append(reachable, a)
		}
	}
	return network{
		sandbox: "The network is closed except for the hosts this deployment's egress rules allow your tenant; " +
			"a connection elsewhere is refused, and the result's egress says so.",
		apis: apisText(reachable),
	}
}

// sandboxText tells a model what the sandbox is, from what the agents
// report: their languages and their defaults.
func sandboxText(info *edgev1.ListLanguagesResponse, net network) string {
	var names, stateful, preloaded []string
	for _, l := range info.GetLanguages() {
		if p := l.GetPreloaded(); len(p) > 0 && len(preloaded) == 0 {
			preloaded = append(preloaded, l.GetName()+": "+strings.Join(p, ", "))
		}
		var about []string
		if v := l.GetVersion(); v != "" {
			about = append(about, v)
		}
		if l.GetCompiled() {
			about = append(about, "compiled in the sandbox")
		}
		n := l.GetName()
		if len(about) > 0 {
			n += " (" + strings.Join(about, ", ") + ")"
		}
		names = append(names, n)
		if l.GetSessionState() != "files" && l.GetSessionState() != "" {
			stateful = append(stateful, l.GetName())
		}
	}
	var b strings.Builder
	if len(names) > 0 {
		fmt.Fprintf(&b, "Languages: %s. ", strings.Join(names, ", "))
	}
	b.WriteString("Python has requests, numpy, pandas, scipy and matplotlib; JavaScript runs under Node.js; " +
		"the shell has curl, git, jq, sqlite3 and the usual tools. ")
	b.WriteString(net.sandbox)
	b.WriteString(" The working directory is /workspace (64 MiB); /tmp holds 16 MiB. ")
	if len(preloaded) > 0 {
		fmt.Fprintf(&b, "Already imported when a run starts, so importing them costs nothing (%s). ", strings.Join(preloaded, "; "))
	}
	if d := info.GetDefaults(); d != nil {
		fmt.Fprintf(&b, "Each run has by default %s of wall-clock time (timeout_seconds, at most %s), %s of memory, one CPU, "+
			"256 processes and %s of output; a run over a limit is killed or cut and says so. ",
			d.GetTimeout().AsDuration(), d.GetMaxTimeout().AsDuration(), bytesText(d.GetMemoryBytes()), bytesText(d.GetOutputBytes()))
	} else {
		b.WriteString("A run over its time, memory or output limit is killed or cut and says so. ")
	}
	b.WriteString("Without session_id each call gets a fresh sandbox that is destroyed afterwards. In a session, /workspace " +
		"and the working directory persist between calls")
	if len(stateful) > 0 {
		fmt.Fprintf(&b, ", and (%s) variables too", strings.Join(stateful, ", "))
	}
	b.WriteString("; a session closes ")
	if d := info.GetDefaults().GetSessionIdleTimeout(); d != nil {
		fmt.Fprintf(&b, "after %s without a run, or ", d.AsDuration())
	}
	b.WriteString("with close_session.")
	return b.String()
}

// bytesText writes n bytes the way the descriptions do: 512 MiB, 1 MiB.
func bytesText(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

func languagesTool() *mcp.Tool {
	return &mcp.Tool{
		Name:        "list_languages",
		Title:       "List languages",
		Description: "List the languages code can be run in, with interpreter versions.",
		Annotations: readOnly(),
	}
}

func readOnly() *mcp.ToolAnnotations {
	return &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: new(false)}
}

// inputSchema returns the schema of In with the property language limited
// to the agents' languages, defaulting to theirs.
func inputSchema[In any](info *edgev1.ListLanguagesResponse) *jsonschema.Schema {
	s, err := jsonschema.For[In](nil)
	if err != nil {
		panic(err) // the input types are this package's own
	}
	if p := s.Properties["language"]; p != nil && len(info.GetLanguages()) > 0 {
		var names []any
		for _, l := range info.GetLanguages() {
			names = append(names, l.GetName())
		}
		p.Enum = names
		// A default that is not among the languages (agents that disagree,
		// or one whose default language's interpreter is missing) would
		// make the schema invalid, and the SDK refuse the tool: then the
		// schema says none, and the agents' default still applies.
		if d := info.GetDefaults().GetLanguage(); d != "" && slices.Contains(names, any(d)) {
			p.Default, _ = json.Marshal(d)
		}
	}
	return s
}

type tools struct {
	open          Opener
	progressEvery time.Duration
	heartbeat     time.Duration
	runs          *runStore
	network       network
}

func (t *tools) addCodeTools(s *mcp.Server, langs *edgev1.ListLanguagesResponse) {
	mcp.AddTool(s, &mcp.Tool{
		Name:  "execute_code",
		Title: "Execute code",
		Description: "Run code in an isolated sandbox and return its stdout, stderr and exit code. " +
			sandboxText(langs, t.network) + " Files the code writes to /workspace/outputs come back with the result, images as image content" +
			" and other files as embedded resources, each also a resource (its uri, codemode://runs/...) that resources/read returns for a while after;" +
			" in python, matplotlib's plt.show() saves each figure there as a PNG." +
			t.network.apis +
			" With a progress token, output is sent as progress notifications while it is produced.",
		InputSchema: inputSchema[ExecuteInput](langs),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: false, IdempotentHint: false, DestructiveHint: new(true), OpenWorldHint: new(false)},
	}, t.executeCode)
	mcp.AddTool(s, &mcp.Tool{
		Name:  "create_session",
		Title: "Create a session",
		Description: "Create a session: a sandbox kept for you whose /workspace, working directory and (python and bash) " +
			"variables persist across execute_code calls with its session_id. It closes after some time without a run (see execute_code), or with close_session.",
		InputSchema: inputSchema[SessionInput](langs),
		Annotations: &mcp.ToolAnnotations{IdempotentHint: false, DestructiveHint: new(false), OpenWorldHint: new(false)},
	}, t.createSession)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "close_session",
		Title:       "Close a session",
		Description: "Close a session and destroy its sandbox and files. Later calls with its id fail, saying it was closed.",
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: new(true), OpenWorldHint: new(false)},
	}, t.closeSession)
}

// countToolCalls counts each tools/call at door by its tool and outcome:
// ok, tool_error (a result with isError, such as a policy denial or a
// program's failure to start), or the protocol error's code.
func countToolCalls(m *telemetry.Metrics, door string) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			call, ok := req.(*mcp.CallToolRequest)
			if !ok || call.Params == nil || m == nil {
				return next(ctx, method, req)
			}
			res, err := next(ctx, method, req)
			outcome := "ok"
			if r, ok := res.(*mcp.CallToolResult); err != nil {
				outcome = "error"
				var je *jsonrpc.Error
				if errors.As(err, &je) {
					outcome = fmt.Sprintf("jsonrpc_%d", je.Code)
				}
			} else if ok && r.IsError {
				outcome = "tool_error"
			}
			m.ObserveToolCall(door, call.Params.Name, outcome)
			return res, err
		}
	}
}

// traceToolCalls gives each tools/call a span, "tools/call NAME", whose
// parent is the span of the HTTP request that carried it: the MCP session
// outlives its requests, so the handler's context is not that request's;
// the request's header is. The span has the tool's name and the request
// id, never the arguments or the result.
func traceToolCalls(t *telemetry.Tracing) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			call, ok := req.(*mcp.CallToolRequest)
			if !ok || call.Params == nil {
				return next(ctx, method, req)
			}
			h := header(call)
			ctx, span := t.Tracer().Start(t.ContextFromHeader(ctx, h), method+" "+call.Params.Name,
				trace.WithAttributes(
					attribute.String("mcp.method.name", method),
					attribute.String("gen_ai.tool.name", call.Params.Name),
					telemetry.AttrRequestID.String(h.Get(server.RequestIDHeader)),
				))
			defer span.End()
			res, err := next(ctx, method, req)
			if r, ok := res.(*mcp.CallToolResult); err != nil || (ok && r.IsError) {
				span.SetStatus(codes.Error, "tool call failed")
			}
			return res, err
		}
	}
}

// failed returns err for a tool result with isError, naming the request id
// so that a user can report it.
func failed(requestID string, err error) error {
	if requestID == "" || strings.Contains(err.Error(), requestID) {
		return err
	}
	return fmt.Errorf("%w (request id %s)", err, requestID)
}

// withRequestID records the request id in a result's _meta.
func withRequestID(res *mcp.CallToolResult, id string) *mcp.CallToolResult {
	res.Meta = mcp.Meta{"codemode/request_id": id}
	return res
}

func header(req *mcp.CallToolRequest) http.Header {
	if req.Extra == nil {
		return nil
	}
	return req.Extra.Header
}

func text(s string) []mcp.Content { return []mcp.Content{&mcp.TextContent{Text: s}} }

func (t *tools) executeCode(ctx context.Context, req *mcp.CallToolRequest, in ExecuteInput) (*mcp.CallToolResult, ExecuteOutput, error) {
	b, id, err := t.open(ctx, header(req))
	if err != nil {
		return nil, ExecuteOutput{}, err
	}
	lang := strings.ToLower(strings.TrimSpace(in.Language))
	ex := &executionv1.Execution{Language: lang, Code: in.Code, SessionId: in.SessionID, Stdin: []byte(in.Stdin)}
	if in.TimeoutSeconds != 0 {
		ex.Timeout = durationpb.New(time.Duration(in.TimeoutSeconds * float64(time.Second)))
	}
	var res *executionv1.Result
	if token := req.Params.GetProgressToken(); token != nil && req.Session != nil {
		res, err = t.stream(ctx, b, ex, newProgress(ctx, req.Session, token, t.progressEvery, t.heartbeat))
	} else {
		res, err = b.Execute(ctx, ex)
	}
	if err != nil {
		// Returned as a tool result with isError, so the model can read it.
		return nil, ExecuteOutput{}, failed(id, err)
	}
	out := ExecuteOutput{
		Stdout: res.GetStdout(), Stderr: res.GetStderr(), ExitCode: res.GetExitCode(),
		TimedOut: res.GetTimedOut(), Truncated: res.GetTruncated(), OOMKilled: res.GetOomKilled(),
		DurationMS: res.GetDuration().AsDuration().Milliseconds(), SessionID: res.GetSessionId(),
		ArtifactsTruncated: res.GetArtifactsTruncated(), Egress: egressOf(res.GetEgress()),
	}
	run := runID(id)
	for _, a := range res.GetArtifacts() {
		out.Artifacts = append(out.Artifacts, Artifact{Name: a.GetName(), MediaType: a.GetMediaType(), Size: a.GetSize(), URI: artifactURI(run, a.GetName())})
	}
	t.runs.keep(req.Session, run, res.GetArtifacts())
	t.runs.useSession(req.Session, res.GetSessionId())
	content := append(text(Summary(res)), ArtifactContent(run, res.GetArtifacts())...)
	return withRequestID(&mcp.CallToolResult{Content: content}, id), out, nil
}

// ArtifactContent renders the artifacts of run as MCP content: an image
// as image content, another file as an embedded resource (text when it is
// text in UTF-8, else a blob) whose URI is the one resources/read takes,
// codemode://runs/RUN/artifacts/NAME.
func ArtifactContent(run string, artifacts []*executionv1.Artifact) []mcp.Content {
	var c []mcp.Content
	for _, a := range artifacts {
		mt := a.GetMediaType()
		if strings.HasPrefix(mt, "image/") {
			c = append(c, &mcp.ImageContent{Data: a.GetContent(), MIMEType: mt})
			continue
		}
		c = append(c, &mcp.EmbeddedResource{Resource: contents(artifactURI(run, a.GetName()), mt, a.GetContent())})
	}
	return c
}

// isText says whether a media type is text a model can read as is.
func isText(mediaType string) bool {
	mt, _, _ := strings.Cut(mediaType, ";")
	mt = strings.TrimSpace(mt)
	return strings.HasPrefix(mt, "text/") || mt == "application/json" || mt == "application/xml" ||
		strings.HasSuffix(mt, "+json") || strings.HasSuffix(mt, "+xml")
}

// stream runs ex with ExecuteStream, sending its output to p as it comes,
// and returns the result with the whole output.
func (t *tools) stream(ctx context.Context, b Backend, ex *executionv1.Execution, p *progress) (*executionv1.Result, error) {
	defer p.stop()
	var stdout, stderr strings.Builder
	var res *executionv1.Result
	err := b.ExecuteStream(ctx, ex, func(ev *executionv1.Event) error {
		switch e := ev.GetEvent().(type) {
		case *executionv1.Event_Stdout:
			stdout.WriteString(e.Stdout)
			p.add(e.Stdout)
		case *executionv1.Event_Stderr:
			stderr.WriteString(e.Stderr)
			p.add(e.Stderr)
		case *executionv1.Event_Result:
			res = e.Result
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if res == nil {
		return nil, fmt.Errorf("the run ended with no result")
	}
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	return res, nil
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
	if as := res.GetArtifacts(); len(as) > 0 {
		names := make([]string, len(as))
		for i, a := range as {
			names[i] = fmt.Sprintf("%s (%s, %d bytes)", a.GetName(), a.GetMediaType(), a.GetSize())
		}
		notes = append(notes, "artifacts in /workspace/outputs: "+strings.Join(names, ", "))
	}
	if res.GetArtifactsTruncated() {
		notes = append(notes, "some artifacts left out for the size limit")
	}
	if e := egressOf(res.GetEgress()); e != nil && (e.Refused > 0 || e.LimitReached != "") {
		n := fmt.Sprintf("egress: %d connections, %d refused", e.Connections, e.Refused)
		if e.LimitReached != "" {
			n += ", " + e.LimitReached + " limit reached"
		}
		notes = append(notes, n)
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

func (t *tools) createSession(ctx context.Context, req *mcp.CallToolRequest, in SessionInput) (*mcp.CallToolResult, SessionOutput, error) {
	b, id, err := t.open(ctx, header(req))
	if err != nil {
		return nil, SessionOutput{}, err
	}
	sess, err := b.CreateSession(ctx, strings.ToLower(strings.TrimSpace(in.Language)))
	if err != nil {
		return nil, SessionOutput{}, failed(id, err)
	}
	t.runs.useSession(req.Session, sess.GetId())
	out := SessionOutput{SessionID: sess.GetId(), Language: sess.GetLanguage()}
	msg := fmt.Sprintf("session %s (%s)", out.SessionID, out.Language)
	if e := sess.GetExpireTime(); e != nil {
		out.ExpireTime = e.AsTime().UTC().Format(time.RFC3339)
		msg += ", closes at " + out.ExpireTime + " if no run comes before"
	}
	return withRequestID(&mcp.CallToolResult{Content: text(msg)}, id), out, nil
}

func (t *tools) closeSession(ctx context.Context, req *mcp.CallToolRequest, in CloseSessionInput) (*mcp.CallToolResult, CloseSessionOutput, error) {
	b, id, err := t.open(ctx, header(req))
	if err != nil {
		return nil, CloseSessionOutput{}, err
	}
	if err := b.CloseSession(ctx, in.SessionID); err != nil {
		return nil, CloseSessionOutput{}, failed(id, err)
	}
	t.runs.forgetSession(req.Session, in.SessionID)
	return withRequestID(&mcp.CallToolResult{Content: text("closed session " + in.SessionID)}, id), CloseSessionOutput{SessionID: in.SessionID, Closed: true}, nil
}

func (t *tools) listLanguages(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, LanguagesOutput, error) {
	b, id, err := t.open(ctx, header(req))
	if err != nil {
		return nil, LanguagesOutput{}, err
	}
	res, err := b.Languages(ctx)
	if err != nil {
		return nil, LanguagesOutput{}, failed(id, err)
	}
	langs := res.GetLanguages()
	out := LanguagesOutput{Languages: []Language{}}
	var names []string
	for _, l := range langs {
		out.Languages = append(out.Languages, Language{Name: l.GetName(), Version: l.GetVersion(), Aliases: l.GetAliases(), Compiled: l.GetCompiled(), SessionState: l.GetSessionState()})
		names = append(names, strings.TrimSpace(l.GetName()+" "+l.GetVersion()))
	}
	return &mcp.CallToolResult{Content: text(strings.Join(names, "\n"))}, out, nil
}
