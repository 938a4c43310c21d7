package execution

import (
	"context"

	"buf.build/go/protovalidate"
	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// validated returns m after checking it with protovalidate, or invalid_argument.
func validated[M proto.Message](m M) (M, error) {
	if err := protovalidate.Validate(m); err != nil {
		var zero M
		return zero, connect.NewError(connect.CodeInvalidArgument, err)
	}
	return m, nil
}

// ListFiles lists directory path of tenant's session id.
func (s *Service) ListFiles(ctx context.Context, tenant, id, path string) ([]*executionv1.FileInfo, bool, error) {
	req, err := validated(&cpv1.ListFilesRequest{SessionId: scopedSession(tenant, id), Path: path})
	if err != nil {
		return nil, false, err
	}
	res, err := s.cp.ListFiles(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, false, err
	}
	return res.Msg.GetFiles(), res.Msg.GetTruncated(), nil
}

// ReadFile reads path from tenant's session id, refusing files larger than
// max bytes (0: the agent's maximum).
func (s *Service) ReadFile(ctx context.Context, tenant, id, path string, max uint64) (*executionv1.File, error) {
	req, err := validated(&cpv1.ReadFileRequest{SessionId: scopedSession(tenant, id), Path: path, MaxBytes: max})
	if err != nil {
		return nil, err
	}
	res, err := s.cp.ReadFile(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetFile(), nil
}

// WriteFile writes f into the caller's session id. Like Execute, it opens
// the session (for Python, placed by the request policies) if it does not
// exist yet, so files can be put in place before the first run.
func (s *Service) WriteFile(ctx context.Context, c Caller, id string, f *executionv1.File) error {
	req, err := validated(&cpv1.WriteFileRequest{SessionId: scopedSession(c.Tenant, id), File: f})
	if err != nil {
		return err
	}
	_, err = s.cp.WriteFile(ctx, connect.NewRequest(req))
	if connect.CodeOf(err) != connect.CodeNotFound {
		return err
	}
	route, err := s.placeSession(ctx, c, "python", req.GetSessionId())
	if err != nil {
		return err
	}
	open := &cpv1.CreateSessionRequest{Language: "python", SessionId: req.GetSessionId(), Route: route}
	if _, err := s.cp.CreateSession(ctx, connect.NewRequest(open)); err != nil && connect.CodeOf(err) != connect.CodeAlreadyExists {
		return err
	}
	_, err = s.cp.WriteFile(ctx, connect.NewRequest(req))
	return err
}
