package agentd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/codemode-go/codemode/agent/internal/cpuslots"
	"github.com/codemode-go/codemode/agent/internal/pool"
	"github.com/codemode-go/codemode/agent/internal/sandbox"
	"github.com/codemode-go/codemode/agent/internal/wire"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/cluster"
	"github.com/codemode-go/codemode/internal/telemetry"
)

var _ agentv1connect.AgentServiceHandler = (*handler)(nil)

// handler adapts the Service to codemode.agent.v1.AgentService.
type handler struct {
	svc *Service
	log *slog.Logger
}

func (h *handler) Execute(ctx context.Context, req *connect.Request[agentv1.ExecuteRequest]) (*connect.Response[agentv1.ExecuteResponse], error) {
	start := time.Now()
	res, err := h.svc.Execute(ctx, callOf(req.Msg), nil)
	if res != nil {
		res.RequestId = req.Msg.GetRequestId()
	}
	h.logRun(ctx, req.Msg, res, err, time.Since(start))
	if err != nil {
		return nil, h.toConnect(err, req.Msg.GetRequestId())
	}
	return connect.NewResponse(&agentv1.ExecuteResponse{Result: res}), nil
}

func (h *handler) ExecuteStream(ctx context.Context, req *connect.Request[agentv1.ExecuteStreamRequest], stream *connect.ServerStream[agentv1.ExecuteStreamResponse]) error {
	start := time.Now()
	res, err := h.svc.Execute(ctx, callOf(req.Msg), func(ev *executionv1.Event) error {
		return stream.Send(&agentv1.ExecuteStreamResponse{Event: ev})
	})
	if res != nil {
		res.RequestId = req.Msg.GetRequestId()
	}
	h.logRun(ctx, req.Msg, res, err, time.Since(start))
	if err != nil {
		return h.toConnect(err, req.Msg.GetRequestId())
	}
	return stream.Send(&agentv1.ExecuteStreamResponse{Event: &executionv1.Event{Event: &executionv1.Event_Result{Result: res}}})
}

// executeRequest is what ExecuteRequest and ExecuteStreamRequest share.
type executeRequest interface {
	GetTenant() string
	GetRequestId() string
	GetAllowNewSession() bool
	GetExecution() *executionv1.Execution
	GetEgress() *executionv1.Egress
}

func callOf(r executeRequest) Call {
	return Call{
		Tenant:          r.GetTenant(),
		RequestID:       r.GetRequestId(),
		AllowNewSession: r.GetAllowNewSession(),
		Execution:       r.GetExecution(),
		Egress:          r.GetEgress(),
	}
}

func (h *handler) CreateSession(ctx context.Context, req *connect.Request[agentv1.CreateSessionRequest]) (*connect.Response[agentv1.CreateSessionResponse], error) {
	sess, err := h.svc.CreateSession(ctx, req.Msg)
	if err != nil {
		return nil, h.toConnect(err, "")
	}
	return connect.NewResponse(&agentv1.CreateSessionResponse{Session: sess}), nil
}

func (h *handler) CloseSession(ctx context.Context, req *connect.Request[agentv1.CloseSessionRequest]) (*connect.Response[agentv1.CloseSessionResponse], error) {
	if err := h.svc.CloseSession(ctx, req.Msg.GetSessionId(), req.Msg.GetTenant()); err != nil {
		return nil, h.toConnect(err, "")
	}
	return connect.NewResponse(&agentv1.CloseSessionResponse{}), nil
}

func (h *handler) GetSession(_ context.Context, req *connect.Request[agentv1.GetSessionRequest]) (*connect.Response[agentv1.GetSessionResponse], error) {
	sess, err := h.svc.GetSession(req.Msg.GetSessionId(), req.Msg.GetTenant())
	if err != nil {
		return nil, h.toConnect(err, "")
	}
	return connect.NewResponse(&agentv1.GetSessionResponse{Session: sess}), nil
}

func (h *handler) Status(context.Context, *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error) {
	return connect.NewResponse(&agentv1.StatusResponse{Status: h.svc.Status()}), nil
}

func (h *handler) ListFiles(ctx context.Context, req *connect.Request[agentv1.ListFilesRequest]) (*connect.Response[agentv1.ListFilesResponse], error) {
	res, err := h.svc.ListFiles(ctx, req.Msg.GetSessionId(), req.Msg.GetTenant(), req.Msg.GetPath())
	if err != nil {
		return nil, h.toConnect(err, "")
	}
	return connect.NewResponse(res), nil
}

func (h *handler) ReadFile(ctx context.Context, req *connect.Request[agentv1.ReadFileRequest]) (*connect.Response[agentv1.ReadFileResponse], error) {
	f, err := h.svc.ReadFile(ctx, req.Msg.GetSessionId(), req.Msg.GetTenant(), req.Msg.GetPath(), req.Msg.GetMaxBytes())
	if err != nil {
		return nil, h.toConnect(err, "")
	}
	return connect.NewResponse(&agentv1.ReadFileResponse{File: f}), nil
}

func (h *handler) WriteFile(ctx context.Context, req *connect.Request[agentv1.WriteFileRequest]) (*connect.Response[agentv1.WriteFileResponse], error) {
	if err := h.svc.WriteFile(ctx, req.Msg.GetSessionId(), req.Msg.GetTenant(), req.Msg.GetFile()); err != nil {
		return nil, h.toConnect(err, "")
	}
	return connect.NewResponse(&agentv1.WriteFileResponse{}), nil
}

// logRun writes the agent's line about one execution.
func (h *handler) logRun(ctx context.Context, r executeRequest, res *executionv1.Result, err error, elapsed time.Duration) {
	e := telemetry.Execution{
		RequestID: r.GetRequestId(),
		Tenant:    r.GetTenant(),
		Language:  r.GetExecution().GetLanguage(),
		Door:      "rpc",
		Agent:     h.svc.cfg.Name,
		SessionID: r.GetExecution().GetSessionId(),
		Result:    res,
		Err:       err,
		Elapsed:   elapsed,
	}
	e.Trace(ctx)
	e.Log(ctx, h.log)
	h.svc.metrics.ObserveExecution(&e)
}

// toConnect turns a service error into the Connect error the caller sees:
// a code that says what to do, and a message without host details. It is
// the agent's one mapping of errors to codes.
func (h *handler) toConnect(err error, requestID string) error {
	code, msg := classify(err)
	switch code {
	case connect.CodeInternal, connect.CodeUnavailable:
		h.log.Warn("execution failed", "request_id", requestID, "code", code.String(), "error", err)
	default:
		h.log.Debug("request refused", "request_id", requestID, "code", code.String(), "error", err)
	}
	out := connect.NewError(code, errors.New(msg))
	if isNotStarted(err) {
		cluster.MarkNotStarted(out)
	}
	if errors.Is(err, pool.ErrSessionNotFound) {
		if d, derr := connect.NewErrorDetail(sessionNotFound(err)); derr == nil {
			out.AddDetail(d)
		}
	}
	return out
}

// sessionNotFound describes err, which matches pool.ErrSessionNotFound.
func sessionNotFound(err error) *executionv1.SessionNotFound {
	var ended *pool.EndedError
	if !errors.As(err, &ended) {
		return &executionv1.SessionNotFound{Reason: executionv1.SessionNotFound_REASON_UNKNOWN}
	}
	out := &executionv1.SessionNotFound{EndTime: timestamppb.New(ended.Ended)}
	switch ended.Reason {
	case pool.EndClosed:
		out.Reason = executionv1.SessionNotFound_REASON_CLOSED
	case pool.EndExpired:
		out.Reason = executionv1.SessionNotFound_REASON_EXPIRED
	default:
		out.Reason = executionv1.SessionNotFound_REASON_LOST
	}
	return out
}

// classify maps an error of the service to a Connect code and a message for
// the caller.
func classify(err error) (connect.Code, string) {
	var rerr *wire.RunnerError
	var tenantLimit *pool.TenantLimitError
	switch {
	case errors.Is(err, errInvalid):
		return connect.CodeInvalidArgument, err.Error()
	case errors.As(err, &rerr):
		// The runner's messages name workspace paths only.
		switch {
		case errors.Is(err, wire.ErrInvalidArgument):
			return connect.CodeInvalidArgument, rerr.Message
		case errors.Is(err, wire.ErrNotFound):
			return connect.CodeNotFound, rerr.Message
		case errors.Is(err, wire.ErrResourceExhausted):
			return connect.CodeResourceExhausted, rerr.Message
		case errors.Is(err, wire.ErrFailedPrecondition):
			return connect.CodeFailedPrecondition, rerr.Message
		case errors.Is(err, wire.ErrBusy):
			return connect.CodeUnavailable, "the sandbox is busy; try again"
		}
		return connect.CodeInternal, "the sandbox failed to run the code"
	case errors.Is(err, pool.ErrSessionExists):
		return connect.CodeAlreadyExists, err.Error()
	case errors.Is(err, pool.ErrSessionNotFound):
		var ended *pool.EndedError
		if errors.As(err, &ended) {
			return connect.CodeNotFound, fmt.Sprintf("the session %s", map[pool.EndReason]string{
				pool.EndClosed: "was closed", pool.EndExpired: "expired after its idle timeout", pool.EndLost: "was lost",
			}[ended.Reason])
		}
		return connect.CodeNotFound, "no such session"
	case errors.As(err, &tenantLimit):
		sessions := "sessions"
		if tenantLimit.Open == 1 {
			sessions = "session"
		}
		return connect.CodeResourceExhausted, fmt.Sprintf("tenant has %d open %s on this agent, the limit per tenant (--max-sessions-per-tenant); close one or let one expire", tenantLimit.Open, sessions)
	case errors.Is(err, pool.ErrTooManySessions):
		return connect.CodeResourceExhausted, err.Error()
	case errors.Is(err, pool.ErrExhausted):
		return connect.CodeResourceExhausted, "every sandbox of this agent is in use; try again later"
	case errors.Is(err, cpuslots.ErrSaturated):
		return connect.CodeResourceExhausted, "this agent's CPUs are saturated: the run waited its queue timeout for its turn; try again later"
	case errors.Is(err, sandbox.ErrUnavailable):
		return connect.CodeUnavailable, "the agent's container engine is unavailable; try again later"
	case errors.Is(err, pool.ErrClosed):
		return connect.CodeUnavailable, "the agent is shutting down"
	case errors.Is(err, pool.ErrDied), errors.Is(err, wire.ErrRunnerGone):
		return connect.CodeUnavailable, "the sandbox died during the run and has been replaced; try again"
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled, "the request was cancelled"
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded, "the request's deadline passed"
	}
	return connect.CodeInternal, "internal error of the agent"
}
