package controlplaned

import (
	"context"
	"time"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/controlplane/internal/router"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// onSession calls fn with the agent holding tenant's session id (see
// locate). A session no agent has is not_found, with the reason when it is
// known to have ended.
func (s *Service) onSession(ctx context.Context, id, tenant string, fn func(*router.Agent) error) error {
	a, confirmed, err := s.locate(ctx, tenant, id)
	if err != nil {
		return err
	}
	if a == nil {
		return goneError(executionv1.SessionNotFound_REASON_UNKNOWN, time.Time{})
	}
	if err := fn(a); err != nil {
		return s.agentError(a, "", s.sessionError(ctx, id, confirmed, err))
	}
	if !confirmed {
		s.bind(ctx, id, tenant, a)
	}
	return nil
}

// ListFiles implements ControlPlaneService.
func (s *Service) ListFiles(ctx context.Context, req *connect.Request[cpv1.ListFilesRequest]) (*connect.Response[cpv1.ListFilesResponse], error) {
	var out *cpv1.ListFilesResponse
	err := s.onSession(ctx, req.Msg.GetSessionId(), req.Msg.GetTenant(), func(a *router.Agent) error {
		res, err := a.Client.ListFiles(ctx, connect.NewRequest(&agentv1.ListFilesRequest{SessionId: req.Msg.GetSessionId(), Path: req.Msg.GetPath(), Tenant: req.Msg.GetTenant()}))
		if err != nil {
			return err
		}
		out = &cpv1.ListFilesResponse{Files: res.Msg.GetFiles(), Truncated: res.Msg.GetTruncated()}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// ReadFile implements ControlPlaneService.
func (s *Service) ReadFile(ctx context.Context, req *connect.Request[cpv1.ReadFileRequest]) (*connect.Response[cpv1.ReadFileResponse], error) {
	var out *cpv1.ReadFileResponse
	err := s.onSession(ctx, req.Msg.GetSessionId(), req.Msg.GetTenant(), func(a *router.Agent) error {
		res, err := a.Client.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{
			SessionId: req.Msg.GetSessionId(), Path: req.Msg.GetPath(), MaxBytes: req.Msg.GetMaxBytes(), Tenant: req.Msg.GetTenant(),
		}))
		if err != nil {
			return err
		}
		out = &cpv1.ReadFileResponse{File: res.Msg.GetFile()}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// WriteFile implements ControlPlaneService.
func (s *Service) WriteFile(ctx context.Context, req *connect.Request[cpv1.WriteFileRequest]) (*connect.Response[cpv1.WriteFileResponse], error) {
	err := s.onSession(ctx, req.Msg.GetSessionId(), req.Msg.GetTenant(), func(a *router.Agent) error {
		_, err := a.Client.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{SessionId: req.Msg.GetSessionId(), File: req.Msg.GetFile(), Tenant: req.Msg.GetTenant()}))
		return err
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cpv1.WriteFileResponse{}), nil
}
