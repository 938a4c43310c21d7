// Package connectapi serves codemode's public ExecutionService (gRPC,
// gRPC-Web and Connect) as a thin adapter over the edge's execution.Service.
package connectapi

import (
	"context"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/edge/internal/execution"
	"github.com/codemode-go/codemode/edge/internal/oidctoken"
	"github.com/codemode-go/codemode/edge/internal/tenant"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
)

// Handler implements ExecutionService.
type Handler struct {
	svc     *execution.Service
	tenants *tenant.Resolver
}

var _ edgev1connect.ExecutionServiceHandler = (*Handler)(nil)

// New returns a Handler over svc that tells tenants apart with tenants.
func New(svc *execution.Service, tenants *tenant.Resolver) *Handler {
	return &Handler{svc: svc, tenants: tenants}
}

func (h *Handler) call(ctx context.Context, req connect.AnyRequest, ex *executionv1.Execution) (execution.Call, error) {
	c, err := h.caller(ctx, req)
	if err != nil {
		return execution.Call{}, err
	}
	if id, ok := tenant.IdentityFromContext(ctx); ok && ex.GetSessionId() != "" {
		// The door checked Execute; a run in a session needs Sessions too.
		if err := tenant.Require(id, oidctoken.Sessions); err != nil {
			return execution.Call{}, err
		}
	}
	return execution.Call{Execution: ex, Tenant: c.Tenant, Door: c.Door, RequestID: c.RequestID, Subject: c.Subject}, nil
}

// caller returns who makes req: its tenant (resolved before the body was
// read, see tenant.Resolver.Authenticate), door and request id.
func (h *Handler) caller(ctx context.Context, req connect.AnyRequest) (execution.Caller, error) {
	t, err := h.tenants.Of(ctx, req.Header())
	if err != nil {
		return execution.Caller{}, connect.NewError(connect.CodeUnauthenticated, err)
	}
	id, _ := tenant.IdentityFromContext(ctx)
	return execution.Caller{Tenant: t, Door: req.Peer().Protocol, RequestID: req.Header().Get(server.RequestIDHeader), Subject: id.Subject}, nil
}

// Execute implements ExecutionService.
func (h *Handler) Execute(ctx context.Context, req *connect.Request[edgev1.ExecuteRequest]) (*connect.Response[edgev1.ExecuteResponse], error) {
	ex, err := execution.FromRequest(req.Msg)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	call, err := h.call(ctx, req, ex)
	if err != nil {
		return nil, err
	}
	res, err := h.svc.Execute(ctx, call)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&edgev1.ExecuteResponse{Result: res}), nil
}

// ExecuteStream implements ExecutionService.
func (h *Handler) ExecuteStream(ctx context.Context, req *connect.Request[edgev1.ExecuteStreamRequest], stream *connect.ServerStream[edgev1.ExecuteStreamResponse]) error {
	ex, err := execution.FromRequest(req.Msg)
	if err != nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	call, err := h.call(ctx, req, ex)
	if err != nil {
		return err
	}
	return h.svc.ExecuteStream(ctx, call, func(ev *executionv1.Event) error {
		return stream.Send(&edgev1.ExecuteStreamResponse{Event: ev})
	})
}

// CreateSession implements ExecutionService.
func (h *Handler) CreateSession(ctx context.Context, req *connect.Request[edgev1.CreateSessionRequest]) (*connect.Response[edgev1.CreateSessionResponse], error) {
	c, err := h.caller(ctx, req)
	if err != nil {
		return nil, err
	}
	sess, err := h.svc.CreateSession(ctx, c, req.Msg.GetLanguage(), req.Msg.GetIdleTimeout().AsDuration())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&edgev1.CreateSessionResponse{Session: sess}), nil
}

// CloseSession implements ExecutionService.
func (h *Handler) CloseSession(ctx context.Context, req *connect.Request[edgev1.CloseSessionRequest]) (*connect.Response[edgev1.CloseSessionResponse], error) {
	c, err := h.caller(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := h.svc.CloseSession(ctx, c, req.Msg.GetSessionId()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&edgev1.CloseSessionResponse{}), nil
}

// ListLanguages implements ExecutionService.
func (h *Handler) ListLanguages(ctx context.Context, req *connect.Request[edgev1.ListLanguagesRequest]) (*connect.Response[edgev1.ListLanguagesResponse], error) {
	c, err := h.caller(ctx, req)
	if err != nil {
		return nil, err
	}
	res, err := h.svc.Languages(ctx, c)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(res), nil
}

// ListFiles implements ExecutionService.
func (h *Handler) ListFiles(ctx context.Context, req *connect.Request[edgev1.ListFilesRequest]) (*connect.Response[edgev1.ListFilesResponse], error) {
	c, err := h.caller(ctx, req)
	if err != nil {
		return nil, err
	}
	files, truncated, err := h.svc.ListFiles(ctx, c, req.Msg.GetSessionId(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&edgev1.ListFilesResponse{Files: files, Truncated: truncated}), nil
}

// ReadFile implements ExecutionService.
func (h *Handler) ReadFile(ctx context.Context, req *connect.Request[edgev1.ReadFileRequest]) (*connect.Response[edgev1.ReadFileResponse], error) {
	c, err := h.caller(ctx, req)
	if err != nil {
		return nil, err
	}
	f, err := h.svc.ReadFile(ctx, c, req.Msg.GetSessionId(), req.Msg.GetPath(), req.Msg.GetMaxBytes())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&edgev1.ReadFileResponse{File: f}), nil
}

// WriteFile implements ExecutionService.
func (h *Handler) WriteFile(ctx context.Context, req *connect.Request[edgev1.WriteFileRequest]) (*connect.Response[edgev1.WriteFileResponse], error) {
	c, err := h.caller(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := h.svc.WriteFile(ctx, c, req.Msg.GetSessionId(), req.Msg.GetFile()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&edgev1.WriteFileResponse{}), nil
}
