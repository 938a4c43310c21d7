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

// ListFiles lists directory path of the caller's session id.
func (s *Service) ListFiles(ctx context.Context, c Caller, id, path string) (_ []*executionv1.FileInfo, _ bool, err error) {
	c = c.withID()
	defer s.publicError(c, id, &err)
	req, err := validated(&cpv1.ListFilesRequest{SessionId: s.scoped(c.Tenant, id), Path: path, Tenant: c.Tenant})
	if err != nil {
		return nil, false, err
	}
	release, err := s.admit(ctx, c.Tenant)
	if err != nil {
		return nil, false, err
	}
	defer release()
	res, err := s.cp.ListFiles(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, false, err
	}
	return res.Msg.GetFiles(), res.Msg.GetTruncated(), nil
}

// ReadFile reads path from the caller's session id, refusing files larger
// than max bytes (0: the agent's maximum).
func (s *Service) ReadFile(ctx context.Context, c Caller, id, path string, max uint64) (_ *executionv1.File, err error) {
	c = c.withID()
	defer s.publicError(c, id, &err)
	req, err := validated(&cpv1.ReadFileRequest{SessionId: s.scoped(c.Tenant, id), Path: path, MaxBytes: max, Tenant: c.Tenant})
	if err != nil {
		return nil, err
	}
	release, err := s.admit(ctx, c.Tenant)
	if err != nil {
		return nil, err
	}
	defer release()
	res, err := s.cp.ReadFile(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return res.Msg.GetFile(), nil
}

// WriteFile writes f into the caller's session id. Like Execute, it opens
// the session (for the agents' default language, placed by the request
// policies) if no session of
// that id ever existed, so files can be put in place before the first run;
// a session that ended is not_found.
func (s *Service) WriteFile(ctx context.Context, c Caller, id string, f *executionv1.File) (err error) {
	c = c.withID()
	defer s.publicError(c, id, &err)
	req, err := validated(&cpv1.WriteFileRequest{SessionId: s.scoped(c.Tenant, id), File: f, Tenant: c.Tenant})
	if err != nil {
		return err
	}
	release, err := s.admit(ctx, c.Tenant)
	if err != nil {
		return err
	}
	defer release()
	_, err = s.cp.WriteFile(ctx, connect.NewRequest(req))
	if connect.CodeOf(err) != connect.CodeNotFound || SessionNotFoundReason(err) != executionv1.SessionNotFound_REASON_UNKNOWN {
		return err
	}
	// The session is the agents' default language's, as one opened
	// without naming a language is.
	lang := s.languages.currentDefaults(ctx).GetLanguage()
	route, err := s.placeSession(ctx, c, lang, req.GetSessionId())
	if err != nil {
		return err
	}
	open := &cpv1.CreateSessionRequest{Language: lang, SessionId: req.GetSessionId(), Route: route, Tenant: c.Tenant}
	if _, err := s.cp.CreateSession(ctx, connect.NewRequest(open)); err != nil && connect.CodeOf(err) != connect.CodeAlreadyExists {
		return err
	}
	_, err = s.cp.WriteFile(ctx, connect.NewRequest(req))
	return err
}
