package controlplane

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/controlplane/internal/router"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
)

// onSession calls fn with the agent holding session id. When the router does
// not know the session (the control plane restarted), every agent is asked
// until one has it. A session no agent has is not_found.
func (s *Service) onSession(ctx context.Context, id string, fn func(*router.Agent) error) error {
	agents := s.router.All()
	if a, ok := s.router.Session(id); ok {
		agents = []*router.Agent{a}
	}
	var errs []error
	for _, a := range agents {
		err := fn(a)
		if err == nil {
			s.router.Bind(id, a)
			return nil
		}
		if connect.CodeOf(err) != connect.CodeNotFound || len(agents) == 1 {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		var ce *connect.Error
		if errors.As(errs[0], &ce) {
			return ce
		}
		return connect.NewError(connect.CodeUnavailable, errors.New("agent unreachable"))
	}
	return connect.NewError(connect.CodeNotFound, errors.New("no such session"))
}

// ListFiles implements ControlPlaneService.
func (s *Service) ListFiles(ctx context.Context, req *connect.Request[cpv1.ListFilesRequest]) (*connect.Response[cpv1.ListFilesResponse], error) {
	var out *cpv1.ListFilesResponse
	err := s.onSession(ctx, req.Msg.GetSessionId(), func(a *router.Agent) error {
		res, err := a.Client.ListFiles(ctx, connect.NewRequest(&agentv1.ListFilesRequest{SessionId: req.Msg.GetSessionId(), Path: req.Msg.GetPath()}))
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
	err := s.onSession(ctx, req.Msg.GetSessionId(), func(a *router.Agent) error {
		res, err := a.Client.ReadFile(ctx, connect.NewRequest(&agentv1.ReadFileRequest{
			SessionId: req.Msg.GetSessionId(), Path: req.Msg.GetPath(), MaxBytes: req.Msg.GetMaxBytes(),
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
	err := s.onSession(ctx, req.Msg.GetSessionId(), func(a *router.Agent) error {
		_, err := a.Client.WriteFile(ctx, connect.NewRequest(&agentv1.WriteFileRequest{SessionId: req.Msg.GetSessionId(), File: req.Msg.GetFile()}))
		return err
	})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cpv1.WriteFileResponse{}), nil
}
