// Package execution is the edge's one path for running code: every door
// (Connect, gRPC, gRPC-Web, MCP, the web page) is a thin adapter over a
// Service. It validates the request, scopes sessions to the caller's tenant,
// and forwards to the control plane.
//
// A Service is safe for concurrent use.
package execution

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"time"

	"buf.build/go/protovalidate"
	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/edge/internal/policy"
	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
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
}

// Service runs code through the control plane.
type Service struct {
	cp       controlplanev1connect.ControlPlaneServiceClient
	logger   *slog.Logger
	policies *policy.Engine // nil: no policies
}

// New returns a Service that forwards to the control plane client cp.
func New(cp controlplanev1connect.ControlPlaneServiceClient, logger *slog.Logger, opts ...Option) *Service {
	s := &Service{cp: cp, logger: logger}
	for _, o := range opts {
		o(s)
	}
	return s
}

// NewRequestID returns a random request id.
func NewRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// scopedSession maps a caller's session id into its tenant's namespace, so
// that one tenant can never reach another's session, whatever id it sends.
func scopedSession(tenant, id string) string {
	if id == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(tenant + "\x00" + id))
	return "s" + hex.EncodeToString(sum[:20])
}

// prepare validates call and returns the execution to forward, with its
// session id scoped to the tenant.
func prepare(call *Call) (*executionv1.Execution, error) {
	if call.Execution == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("no execution"))
	}
	if err := protovalidate.Validate(call.Execution); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if call.RequestID == "" {
		call.RequestID = NewRequestID()
	}
	ex := call.Execution
	out := &executionv1.Execution{
		Language:  ex.GetLanguage(),
		Code:      ex.GetCode(),
		SessionId: scopedSession(call.Tenant, ex.GetSessionId()),
		Timeout:   ex.GetTimeout(),
		Stdin:     ex.GetStdin(),
		Files:     ex.GetFiles(),
		Limits:    ex.GetLimits(),
	}
	return out, nil
}

// Execute runs call and returns its result.
func (s *Service) Execute(ctx context.Context, call Call) (*executionv1.Result, error) {
	ex, err := prepare(&call)
	if err != nil {
		return nil, err
	}
	v, err := s.vetRequest(ctx, call, ex)
	if err != nil {
		s.logFailure(call, err)
		return nil, err
	}
	ex = v.ex
	start := time.Now()
	res, err := s.cp.Execute(ctx, connect.NewRequest(&cpv1.ExecuteRequest{Execution: ex, RequestId: call.RequestID, Route: v.route}))
	if err != nil {
		s.logFailure(call, err)
		return nil, err
	}
	r := res.Msg.GetResult()
	r.SessionId = call.Execution.GetSessionId()
	if r, err = s.vetResult(ctx, call, v, r); err != nil {
		s.logFailure(call, err)
		return nil, err
	}
	s.logger.Debug("executed", "request_id", call.RequestID, "tenant", call.Tenant, "door", call.Door,
		"language", ex.GetLanguage(), "exit_code", r.GetExitCode(), "elapsed", time.Since(start))
	return r, nil
}

// ExecuteStream runs call, passing each event to send as it comes. The last
// event is the result.
func (s *Service) ExecuteStream(ctx context.Context, call Call, send func(*executionv1.Event) error) error {
	ex, err := prepare(&call)
	if err != nil {
		return err
	}
	v, err := s.vetRequest(ctx, call, ex)
	if err != nil {
		s.logFailure(call, err)
		return err
	}
	ex = v.ex
	if s.holdsOutput() {
		send = s.heldOutput(ctx, call, v, send)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := s.cp.ExecuteStream(ctx, connect.NewRequest(&cpv1.ExecuteStreamRequest{Execution: ex, RequestId: call.RequestID, Route: v.route}))
	if err != nil {
		s.logFailure(call, err)
		return err
	}
	defer st.Close()
	for st.Receive() {
		ev := st.Msg().GetEvent()
		if r := ev.GetResult(); r != nil {
			r.SessionId = call.Execution.GetSessionId()
		}
		if err := send(ev); err != nil {
			return err
		}
	}
	if err := st.Err(); err != nil {
		s.logFailure(call, err)
		return err
	}
	return nil
}

func (s *Service) logFailure(call Call, err error) {
	lvl := slog.LevelWarn
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeCanceled, connect.CodePermissionDenied, connect.CodeNotFound:
		lvl = slog.LevelDebug
	}
	s.logger.Log(context.Background(), lvl, "execute failed", "request_id", call.RequestID, "tenant", call.Tenant, "door", call.Door, "error", err)
}

// Caller is who makes a request that is not an execution: the tenant, the
// door and the request id, as in Call.
type Caller struct {
	Tenant, Door, RequestID string
}

// CreateSession creates a session for the caller and returns it with the id
// the caller is to use. The request policies place it (see placeSession).
func (s *Service) CreateSession(ctx context.Context, c Caller, language string, idle time.Duration) (*executionv1.Session, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	public := hex.EncodeToString(b[:])
	req := &cpv1.CreateSessionRequest{Language: language, SessionId: scopedSession(c.Tenant, public)}
	if idle > 0 {
		req.IdleTimeout = durationpb.New(idle)
	}
	if err := protovalidate.Validate(req); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	route, err := s.placeSession(ctx, c, language, req.GetSessionId())
	if err != nil {
		return nil, err
	}
	req.Route = route
	res, err := s.cp.CreateSession(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	sess := res.Msg.GetSession()
	sess.Id = public
	return sess, nil
}

// CloseSession closes tenant's session id.
func (s *Service) CloseSession(ctx context.Context, tenant, id string) error {
	if id == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("session_id is empty"))
	}
	_, err := s.cp.CloseSession(ctx, connect.NewRequest(&cpv1.CloseSessionRequest{SessionId: scopedSession(tenant, id)}))
	return err
}

// Languages returns the languages some agent can run now.
func (s *Service) Languages(ctx context.Context) ([]*executionv1.Language, error) {
	res, err := s.cp.ListLanguages(ctx, connect.NewRequest(&cpv1.ListLanguagesRequest{}))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetLanguages(), nil
}
