package mcpserver

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/edge/internal/directtools"
	"github.com/codemode-go/codemode/edge/internal/execution"
	"github.com/codemode-go/codemode/edge/internal/oidctoken"
	"github.com/codemode-go/codemode/edge/internal/tenant"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/apicatalog"
	"github.com/codemode-go/codemode/internal/server"
)

// A Backend does what the tools ask for, on behalf of one caller. Its
// errors are for the caller to read: they become tool results with isError.
type Backend interface {
	// Execute runs ex and returns its result.
	Execute(ctx context.Context, ex *executionv1.Execution) (*executionv1.Result, error)
	// ExecuteStream runs ex, passing each event to send as it comes; the
	// last is the result.
	ExecuteStream(ctx context.Context, ex *executionv1.Execution, send func(*executionv1.Event) error) error
	CreateSession(ctx context.Context, language string) (*executionv1.Session, error)
	CloseSession(ctx context.Context, id string) error
	ListFiles(ctx context.Context, id, path string) (files []*executionv1.FileInfo, truncated bool, err error)
	ReadFile(ctx context.Context, id, path string) (*executionv1.File, error)
	WriteFile(ctx context.Context, id string, f *executionv1.File) error
	// Languages returns the languages some agent runs now, and the agents'
	// defaults.
	Languages(ctx context.Context) (*edgev1.ListLanguagesResponse, error)
	// CallAPI calls a declared API tool with arguments (a JSON object) and
	// returns the API's answer, whatever its status.
	CallAPI(ctx context.Context, tool *apicatalog.Tool, arguments []byte) (*directtools.Response, error)
}

// An Opener returns the Backend for one MCP request and the request's id.
// h is the header of the HTTP request that carries the MCP request, nil on
// stdio. ctx is not that HTTP request's context: a tool call runs in its
// MCP session's, which carries the values of the request that opened the
// session.
type Opener func(ctx context.Context, h http.Header) (b Backend, requestID string, err error)

// Local returns an Opener over the edge's own Service, and its API calls
// (nil: none): the tenant is the one whose API key the HTTP request
// carries (the edge checked it before MCP read the body). It is read from
// h, the current request's header, never from ctx, whose tenant is the one
// of whoever opened the session.
func Local(svc *execution.Service, calls *directtools.Service, tenants *tenant.Resolver) Opener {
	return func(_ context.Context, h http.Header) (Backend, string, error) {
		id, err := tenants.Identify(context.Background(), h)
		if err != nil {
			return nil, "", err
		}
		c := execution.Caller{Tenant: id.Tenant, Door: "mcp", RequestID: h.Get(server.RequestIDHeader), Subject: id.Subject}
		if c.RequestID == "" {
			c.RequestID = execution.NewRequestID()
		}
		return &local{svc: svc, calls: calls, c: c, id: id}, c.RequestID, nil
	}
}

type local struct {
	svc   *execution.Service
	calls *directtools.Service
	c     execution.Caller
	id    tenant.Identity // the rights of c's credential
}

// may returns nil when the caller holds want (see tenant.Require).
func (l *local) may(want oidctoken.Rights) error { return tenant.Require(l.id, want) }

// mayRun returns nil when the caller may run ex: in a session, it needs
// the right to sessions too.
func (l *local) mayRun(ex *executionv1.Execution) error {
	if ex.GetSessionId() != "" {
		return l.may(oidctoken.Execute | oidctoken.Sessions)
	}
	return l.may(oidctoken.Execute)
}

func (l *local) call(ex *executionv1.Execution) execution.Call {
	return execution.Call{Execution: ex, Tenant: l.c.Tenant, Door: l.c.Door, RequestID: l.c.RequestID, Subject: l.c.Subject}
}

func (l *local) Execute(ctx context.Context, ex *executionv1.Execution) (*executionv1.Result, error) {
	if err := l.mayRun(ex); err != nil {
		return nil, err
	}
	return l.svc.Execute(ctx, l.call(ex))
}

func (l *local) ExecuteStream(ctx context.Context, ex *executionv1.Execution, send func(*executionv1.Event) error) error {
	if err := l.mayRun(ex); err != nil {
		return err
	}
	return l.svc.ExecuteStream(ctx, l.call(ex), send)
}

func (l *local) CreateSession(ctx context.Context, language string) (*executionv1.Session, error) {
	if err := l.may(oidctoken.Sessions); err != nil {
		return nil, err
	}
	return l.svc.CreateSession(ctx, l.c, language, 0)
}

func (l *local) CloseSession(ctx context.Context, id string) error {
	if err := l.may(oidctoken.Sessions); err != nil {
		return err
	}
	return l.svc.CloseSession(ctx, l.c, id)
}

func (l *local) ListFiles(ctx context.Context, id, path string) ([]*executionv1.FileInfo, bool, error) {
	if err := l.may(oidctoken.Sessions); err != nil {
		return nil, false, err
	}
	return l.svc.ListFiles(ctx, l.c, id, path)
}

func (l *local) ReadFile(ctx context.Context, id, path string) (*executionv1.File, error) {
	if err := l.may(oidctoken.Sessions); err != nil {
		return nil, err
	}
	return l.svc.ReadFile(ctx, l.c, id, path, 0)
}

func (l *local) WriteFile(ctx context.Context, id string, f *executionv1.File) error {
	if err := l.may(oidctoken.Sessions); err != nil {
		return err
	}
	return l.svc.WriteFile(ctx, l.c, id, f)
}

func (l *local) Languages(ctx context.Context) (*edgev1.ListLanguagesResponse, error) {
	return l.svc.Languages(ctx, l.c)
}

func (l *local) CallAPI(ctx context.Context, tool *apicatalog.Tool, arguments []byte) (*directtools.Response, error) {
	if l.calls == nil {
		return nil, errNoAPICalls
	}
	if err := l.may(oidctoken.APIs); err != nil {
		return nil, err
	}
	return l.calls.Call(ctx, directtools.Call{Tool: tool, Arguments: arguments, Tenant: l.c.Tenant, RequestID: l.c.RequestID, Subject: l.c.Subject})
}

// errNoAPICalls is the error of an API tool called where no edge makes
// API calls; the tool sets offer none there, so it means a wiring mistake.
var errNoAPICalls = connect.NewError(connect.CodeUnimplemented, errors.New("declared API tools are served by an edge's /mcp-no-code-execute only"))

// Remote returns an Opener that forwards to an edge's ExecutionService
// through client, which carries the caller's API key. Each request gets a
// new request id, sent to the edge so that both sides log the same one.
func Remote(client edgev1connect.ExecutionServiceClient) Opener {
	return func(context.Context, http.Header) (Backend, string, error) {
		id := execution.NewRequestID()
		return &remote{client: client, id: id}, id, nil
	}
}

type remote struct {
	client edgev1connect.ExecutionServiceClient
	id     string
}

func request[T any](r *remote, msg *T) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set(server.RequestIDHeader, r.id)
	return req
}

func (r *remote) Execute(ctx context.Context, ex *executionv1.Execution) (*executionv1.Result, error) {
	req := &edgev1.ExecuteRequest{}
	if err := execution.Convert(req, ex); err != nil {
		return nil, err
	}
	res, err := r.client.Execute(ctx, request(r, req))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetResult(), nil
}

func (r *remote) ExecuteStream(ctx context.Context, ex *executionv1.Execution, send func(*executionv1.Event) error) error {
	req := &edgev1.ExecuteStreamRequest{}
	if err := execution.Convert(req, ex); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := r.client.ExecuteStream(ctx, request(r, req))
	if err != nil {
		return err
	}
	defer st.Close()
	for st.Receive() {
		if err := send(st.Msg().GetEvent()); err != nil {
			return err
		}
	}
	return st.Err()
}

func (r *remote) CreateSession(ctx context.Context, language string) (*executionv1.Session, error) {
	res, err := r.client.CreateSession(ctx, request(r, &edgev1.CreateSessionRequest{Language: language}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetSession(), nil
}

func (r *remote) CloseSession(ctx context.Context, id string) error {
	_, err := r.client.CloseSession(ctx, request(r, &edgev1.CloseSessionRequest{SessionId: id}))
	return err
}

func (r *remote) ListFiles(ctx context.Context, id, path string) ([]*executionv1.FileInfo, bool, error) {
	res, err := r.client.ListFiles(ctx, request(r, &edgev1.ListFilesRequest{SessionId: id, Path: path}))
	if err != nil {
		return nil, false, err
	}
	return res.Msg.GetFiles(), res.Msg.GetTruncated(), nil
}

func (r *remote) ReadFile(ctx context.Context, id, path string) (*executionv1.File, error) {
	res, err := r.client.ReadFile(ctx, request(r, &edgev1.ReadFileRequest{SessionId: id, Path: path}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetFile(), nil
}

func (r *remote) WriteFile(ctx context.Context, id string, f *executionv1.File) error {
	_, err := r.client.WriteFile(ctx, request(r, &edgev1.WriteFileRequest{SessionId: id, File: f}))
	return err
}

// CallAPI fails: the Connect API has no call for API tools, and over stdio
// none are offered (see Config.APIs).
func (r *remote) CallAPI(context.Context, *apicatalog.Tool, []byte) (*directtools.Response, error) {
	return nil, errNoAPICalls
}

func (r *remote) Languages(ctx context.Context) (*edgev1.ListLanguagesResponse, error) {
	res, err := r.client.ListLanguages(ctx, request(r, &edgev1.ListLanguagesRequest{}))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

// languageCache remembers the languages the agents run, and their
// defaults, for a while, so that a new MCP session does not ask the control
// plane for its tool list each time.
type languageCache struct {
	ttl  time.Duration
	mu   sync.Mutex
	at   time.Time
	last *edgev1.ListLanguagesResponse
}

// get returns what fetch says the agents run, or the last answer if it is
// younger than ttl or fetch fails. The edge knows no languages or defaults
// of its own: with no answer yet it returns an empty response.
func (lc *languageCache) get(ctx context.Context, fetch func(context.Context) (*edgev1.ListLanguagesResponse, error)) *edgev1.ListLanguagesResponse {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.last != nil && time.Since(lc.at) < lc.ttl {
		return lc.last
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := fetch(ctx)
	if err == nil && len(res.GetLanguages()) > 0 {
		lc.last, lc.at = res, time.Now()
		for _, l := range res.GetLanguages() {
			if l.GetVersion() == "" {
				// An agent that has not started a sandbox yet knows no
				// versions: ask again next time.
				lc.at = time.Time{}
				break
			}
		}
		return res
	}
	if lc.last == nil {
		return &edgev1.ListLanguagesResponse{} // the tools then list no enum
	}
	return lc.last
}
