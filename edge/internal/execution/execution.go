// Package execution is the edge's one path for running code: every door
// (Connect, gRPC, gRPC-Web, MCP, the web page) is a thin adapter over a
// Service. It validates the request, scopes sessions to the caller's tenant,
// and forwards to the control plane.
//
// A Service is safe for concurrent use.
package execution

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"buf.build/go/protovalidate"
	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/edge/internal/policy"
	"github.com/codemode-go/codemode/edge/internal/ratelimit"
	"github.com/codemode-go/codemode/edge/internal/tenant"
	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/cluster"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/telemetry"
)

// Call is one request to run code, as a door hands it to the Service.
type Call struct {
	// Execution is what to run. Its session id is the caller's, not yet scoped.
	Execution *executionv1.Execution
	// Tenant is who asks.
	Tenant string
	// Door is how the request came in: "connect", "grpc", "grpcweb", "mcp", "http".
	Door string
	// RequestID identifies the request in logs; the Service makes one if empty.
	RequestID string
	// Subject is a hash of who asks within the tenant, for callers with a
	// token (see tenant.Identity); "" otherwise. Policies and logs see it.
	Subject string
}

// caller returns who makes call.
func (c *Call) caller() Caller {
	return Caller{Tenant: c.Tenant, Door: c.Door, RequestID: c.RequestID, Subject: c.Subject}
}

// Service runs code through the control plane.
type Service struct {
	cp         controlplanev1connect.ControlPlaneServiceClient
	logger     *slog.Logger
	policies   *policy.Engine // nil: no policies
	sessionKey []byte
	admission  *ratelimit.Limiter // nil: no limits
	languages  *languages
	egress     *tenant.EgressConfig // nil: runs reach nothing
	metrics    *telemetry.Metrics   // nil: none
}

// SessionKeyPurpose names the key that maps session ids (see WithSessionKey).
const SessionKeyPurpose = "codemode session ids v1"

// New returns a Service that forwards to the control plane client cp.
func New(cp controlplanev1connect.ControlPlaneServiceClient, logger *slog.Logger, opts ...Option) *Service {
	s := &Service{cp: cp, logger: logger, languages: &languages{cp: cp}}
	for _, o := range opts {
		o(s)
	}
	if s.sessionKey == nil {
		s.sessionKey = (*cluster.Secret)(nil).Key(SessionKeyPurpose)
	}
	return s
}

// WithSessionKey sets the key that maps a tenant's session ids to the ids
// the control plane and agents know (see scoped). Every edge of a cluster
// must use the same key, derived from the cluster secret.
func WithSessionKey(key []byte) Option {
	return func(s *Service) { s.sessionKey = key }
}

// WithMetrics records each execution in m.
func WithMetrics(m *telemetry.Metrics) Option {
	return func(s *Service) { s.metrics = m }
}

// NewRequestID returns a random request id.
func NewRequestID() string { return server.NewRequestID() }

// scoped maps tenant's session id to the id the control plane and agents
// know: a MAC of tenant and id under a key that never leaves the cluster.
// Knowing another tenant's id, or anything derived from it, does not give
// the scoped id; and the tenant travels with every internal call, so that
// the agent checks it too.
func (s *Service) scoped(tenant, id string) string {
	if id == "" {
		return ""
	}
	m := hmac.New(sha256.New, s.sessionKey)
	m.Write([]byte(tenant))
	m.Write([]byte{0})
	m.Write([]byte(id))
	return "s" + hex.EncodeToString(m.Sum(nil)[:20])
}

// prepare validates call and returns the execution to forward, with its
// language defaulted and its session id scoped to the tenant.
func (s *Service) prepare(ctx context.Context, call *Call) (*executionv1.Execution, error) {
	if call.RequestID == "" {
		call.RequestID = NewRequestID()
	}
	if call.Execution == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("no execution"))
	}
	ex := proto.CloneOf(call.Execution)
	if err := protovalidate.Validate(ex); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	// The agents' defaults, so that policies see the language and timeout
	// the run will have. Without them (no agent ready) the agent fills in
	// its own.
	d := s.languages.currentDefaults(ctx)
	if ex.Language == "" {
		ex.Language = d.GetLanguage()
	}
	if ex.Language != "" {
		lang, err := s.languages.canonical(ctx, ex.Language)
		if err != nil {
			return nil, err
		}
		ex.Language = lang
	}
	if ex.Timeout == nil && d.GetTimeout() != nil {
		ex.Timeout = d.GetTimeout()
	}
	if max := d.GetMaxTimeout(); max != nil && ex.GetTimeout().AsDuration() > max.AsDuration() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("timeout %v is longer than the agents allow (%v)", ex.GetTimeout().AsDuration(), max.AsDuration()))
	}
	ex.SessionId = s.scoped(call.Tenant, ex.GetSessionId())
	return ex, nil
}

// Execute runs call and returns its result.
func (s *Service) Execute(ctx context.Context, call Call) (r *executionv1.Result, err error) {
	start := time.Now()
	ex, err := s.prepare(ctx, &call)
	if err != nil {
		return nil, err
	}
	defer func() { s.logExecution(ctx, call, ex, r, err, start) }()
	defer s.publicError(call.caller(), call.Execution.GetSessionId(), &err)
	release, err := s.admit(ctx, call.Tenant)
	if err != nil {
		return nil, err
	}
	defer release()
	v, err := s.vetRequest(ctx, call, ex)
	if err != nil {
		return nil, err
	}
	ex = v.ex
	res, err := s.cp.Execute(ctx, connect.NewRequest(&cpv1.ExecuteRequest{Execution: ex, Egress: v.egress, RequestId: call.RequestID, Route: v.route, Tenant: call.Tenant}))
	if err != nil {
		return nil, err
	}
	r = res.Msg.GetResult()
	if r == nil {
		return nil, connect.NewError(connect.CodeInternal, errors.New("the control plane answered without a result"))
	}
	r.SessionId = call.Execution.GetSessionId()
	r.RequestId = call.RequestID
	if r, err = s.vetResult(ctx, call, v, r); err != nil {
		return nil, err
	}
	return r, nil
}

// logExecution writes the edge's line about one execution.
func (s *Service) logExecution(ctx context.Context, call Call, ex *executionv1.Execution, res *executionv1.Result, err error, start time.Time) {
	if err == nil && res == nil {
		err = errors.New("no result")
	}
	e := telemetry.Execution{
		RequestID: call.RequestID,
		Tenant:    call.Tenant,
		Subject:   call.Subject,
		Door:      call.Door,
		Language:  ex.GetLanguage(),
		SessionID: call.Execution.GetSessionId(),
		Result:    res,
		Err:       err,
		Elapsed:   time.Since(start),
	}
	e.Trace(ctx)
	e.Log(ctx, s.logger)
	s.metrics.ObserveExecution(&e)
}

// ExecuteStream runs call, passing each event to send as it comes. The last
// event is the result.
func (s *Service) ExecuteStream(ctx context.Context, call Call, send func(*executionv1.Event) error) (err error) {
	start := time.Now()
	ex, err := s.prepare(ctx, &call)
	if err != nil {
		return err
	}
	var last *executionv1.Result
	defer func() { s.logExecution(ctx, call, ex, last, err, start) }()
	defer s.publicError(call.caller(), call.Execution.GetSessionId(), &err)
	release, err := s.admit(ctx, call.Tenant)
	if err != nil {
		return err
	}
	defer release()
	v, err := s.vetRequest(ctx, call, ex)
	if err != nil {
		return err
	}
	ex = v.ex
	if s.holdsOutput() {
		send = s.heldOutput(ctx, call, v, send)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := s.cp.ExecuteStream(ctx, connect.NewRequest(&cpv1.ExecuteStreamRequest{Execution: ex, Egress: v.egress, RequestId: call.RequestID, Route: v.route, Tenant: call.Tenant}))
	if err != nil {
		return err
	}
	defer st.Close()
	for st.Receive() {
		ev := st.Msg().GetEvent()
		if r := ev.GetResult(); r != nil {
			r.SessionId = call.Execution.GetSessionId()
			r.RequestId = call.RequestID
			last = r
		}
		if err := send(ev); err != nil {
			return err
		}
	}
	return st.Err()
}

// Caller is who makes a request that is not an execution: the tenant, the
// door and the request id, as in Call.
type Caller struct {
	Tenant, Door, RequestID string
	// Subject as in Call.
	Subject string
}

// withID returns c with a request id, made if it has none.
func (c Caller) withID() Caller {
	if c.RequestID == "" {
		c.RequestID = NewRequestID()
	}
	return c
}

// CreateSession creates a session for the caller and returns it with the id
// the caller is to use. The request policies place it (see placeSession).
func (s *Service) CreateSession(ctx context.Context, c Caller, language string, idle time.Duration) (_ *executionv1.Session, err error) {
	c = c.withID()
	if language == "" {
		language = s.languages.currentDefaults(ctx).GetLanguage()
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	public := hex.EncodeToString(b[:])
	defer s.publicError(c, public, &err)
	req, err := validated(&cpv1.CreateSessionRequest{Language: language, SessionId: s.scoped(c.Tenant, public), Tenant: c.Tenant})
	if err != nil {
		return nil, err
	}
	if language != "" {
		if language, err = s.languages.canonical(ctx, language); err != nil {
			return nil, err
		}
		req.Language = language
	}
	if idle > 0 {
		req.IdleTimeout = durationpb.New(idle)
	}
	release, err := s.admit(ctx, c.Tenant)
	if err != nil {
		return nil, err
	}
	defer release()
	if req.Route, err = s.placeSession(ctx, c, language, req.GetSessionId()); err != nil {
		return nil, err
	}
	res, err := s.cp.CreateSession(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	sess := res.Msg.GetSession()
	sess.Id = public
	return sess, nil
}

// CloseSession closes the caller's session id.
func (s *Service) CloseSession(ctx context.Context, c Caller, id string) (err error) {
	c = c.withID()
	defer s.publicError(c, id, &err)
	req, err := validated(&cpv1.CloseSessionRequest{SessionId: s.scoped(c.Tenant, id), Tenant: c.Tenant})
	if err != nil {
		return err
	}
	if id == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("session_id is empty"))
	}
	release, err := s.admit(ctx, c.Tenant)
	if err != nil {
		return err
	}
	defer release()
	_, err = s.cp.CloseSession(ctx, connect.NewRequest(req))
	return err
}

// Languages returns the languages some agent can run now, and the agents'
// defaults.
func (s *Service) Languages(ctx context.Context, c Caller) (_ *edgev1.ListLanguagesResponse, err error) {
	c = c.withID()
	defer s.publicError(c, "", &err)
	res, err := s.languages.fetch(ctx)
	if err != nil {
		return nil, err
	}
	return &edgev1.ListLanguagesResponse{Languages: res.GetLanguages(), Defaults: res.GetDefaults()}, nil
}

// KnownLanguage reports whether name is a language or alias the agents
// listed when the edge last asked, or whether it has not asked yet. Policy
// rewrites are checked with it.
func (s *Service) KnownLanguage(name string) bool { return s.languages.known(name) }
