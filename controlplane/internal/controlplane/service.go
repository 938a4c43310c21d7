package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/controlplane/internal/router"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// maxAttempts bounds how many agents one stateless run is offered to when
// agents turn it away before running it.
const maxAttempts = 3

// Service implements ControlPlaneService over a Router. It is the one code
// path behind both the Connect API and the seed-compatible HTTP endpoints.
type Service struct {
	router *router.Router
	logger *slog.Logger
}

var _ controlplanev1connect.ControlPlaneServiceHandler = (*Service)(nil)

// NewService returns a Service routing over r.
func NewService(r *router.Router, logger *slog.Logger) *Service {
	return &Service{router: r, logger: logger}
}

// retryable reports whether err means the agent did not take the run, so
// another agent may.
func retryable(err error) bool {
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeResourceExhausted:
		return true
	}
	return false
}

// choose returns the agent for a run: the session's agent if the session
// exists (asking every agent if this control plane does not know where it
// lives), else the best agent for the route. A session that lives on an
// agent the route does not select is failed_precondition: running it there
// would ignore the route, and elsewhere it does not exist.
func (s *Service) choose(ctx context.Context, sessionID string, labels map[string]string, exclude []*router.Agent) (*router.Agent, error) {
	if sessionID == "" {
		a, err := s.router.Pick(labels, exclude...)
		if err != nil {
			return nil, connect.NewError(connect.CodeUnavailable, err)
		}
		return a, nil
	}
	if _, ok := s.router.Session(sessionID); !ok {
		if a := s.findSession(ctx, sessionID); a != nil {
			s.router.Bind(sessionID, a)
		}
	}
	a, err := s.router.PickSession(sessionID, labels)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	if !a.Matches(labels) {
		return nil, connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("the session lives on an agent that this request's route (labels %v) does not select; close it and open it again under the same route", labels))
	}
	return a, nil
}

// findSessionTimeout bounds the search for a session on every agent.
const findSessionTimeout = 2 * time.Second

// findSession asks every agent, at once, whether it holds session id, and
// returns the one that does, or nil. An agent that does not answer in time
// is taken not to hold it.
func (s *Service) findSession(ctx context.Context, id string) *router.Agent {
	ctx, cancel := context.WithTimeout(ctx, findSessionTimeout)
	defer cancel()
	agents := s.router.All()
	found := make(chan *router.Agent, len(agents))
	for _, a := range agents {
		go func() {
			_, err := a.Client.GetSession(ctx, connect.NewRequest(&agentv1.GetSessionRequest{SessionId: id}))
			switch {
			case err == nil:
				found <- a
				return
			case connect.CodeOf(err) != connect.CodeNotFound:
				s.logger.Debug("look for session", "agent", a.Address, "error", err)
			}
			found <- nil
		}()
	}
	for range agents {
		if a := <-found; a != nil {
			return a
		}
	}
	return nil
}

func requestID(id string) string {
	if id != "" {
		return id
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Execute implements ControlPlaneService.
func (s *Service) Execute(ctx context.Context, req *connect.Request[cpv1.ExecuteRequest]) (*connect.Response[cpv1.ExecuteResponse], error) {
	res, err := s.execute(ctx, req.Msg.GetExecution(), req.Msg.GetRoute().GetLabels(), requestID(req.Msg.GetRequestId()))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cpv1.ExecuteResponse{Result: res}), nil
}

func (s *Service) execute(ctx context.Context, ex *executionv1.Execution, labels map[string]string, reqID string) (*executionv1.Result, error) {
	sid := ex.GetSessionId()
	var tried []*router.Agent
	for attempt := 1; ; attempt++ {
		a, err := s.choose(ctx, sid, labels, tried)
		if err != nil {
			return nil, err
		}
		release := a.Acquire()
		res, err := a.Client.Execute(ctx, connect.NewRequest(&agentv1.ExecuteRequest{Execution: ex, RequestId: reqID}))
		release()
		if err == nil {
			return res.Msg.GetResult(), nil
		}
		s.logger.Warn("agent execute failed", "agent", a.Address, "request_id", reqID, "session_id", sid, "attempt", attempt, "error", err)
		if connect.CodeOf(err) == connect.CodeUnavailable && ctx.Err() == nil {
			a.MarkDown(err)
		}
		if sid != "" || !retryable(err) || attempt == maxAttempts || ctx.Err() != nil {
			return nil, err
		}
		tried = append(tried, a)
	}
}

// ExecuteStream implements ControlPlaneService.
func (s *Service) ExecuteStream(ctx context.Context, req *connect.Request[cpv1.ExecuteStreamRequest], stream *connect.ServerStream[cpv1.ExecuteStreamResponse]) error {
	return s.executeStream(ctx, req.Msg.GetExecution(), req.Msg.GetRoute().GetLabels(), requestID(req.Msg.GetRequestId()),
		func(ev *executionv1.Event) error { return stream.Send(&cpv1.ExecuteStreamResponse{Event: ev}) })
}

func (s *Service) executeStream(ctx context.Context, ex *executionv1.Execution, labels map[string]string, reqID string, send func(*executionv1.Event) error) error {
	sid := ex.GetSessionId()
	var tried []*router.Agent
	for attempt := 1; ; attempt++ {
		a, err := s.choose(ctx, sid, labels, tried)
		if err != nil {
			return err
		}
		sent, err := s.streamFrom(ctx, a, ex, reqID, send)
		if err == nil {
			return nil
		}
		s.logger.Warn("agent execute stream failed", "agent", a.Address, "request_id", reqID, "session_id", sid, "attempt", attempt, "error", err)
		if connect.CodeOf(err) == connect.CodeUnavailable && ctx.Err() == nil && !sent {
			a.MarkDown(err)
		}
		if sent || sid != "" || !retryable(err) || attempt == maxAttempts || ctx.Err() != nil {
			return err
		}
		tried = append(tried, a)
	}
}

// streamFrom relays one agent's stream; sent reports whether any event went
// on to the caller (after which the run cannot be offered elsewhere).
func (s *Service) streamFrom(ctx context.Context, a *router.Agent, ex *executionv1.Execution, reqID string, send func(*executionv1.Event) error) (sent bool, err error) {
	release := a.Acquire()
	defer release()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := a.Client.ExecuteStream(ctx, connect.NewRequest(&agentv1.ExecuteStreamRequest{Execution: ex, RequestId: reqID}))
	if err != nil {
		return false, err
	}
	defer st.Close()
	for st.Receive() {
		if err := send(st.Msg().GetEvent()); err != nil {
			return true, err
		}
		sent = true
	}
	return sent, st.Err()
}

// CreateSession implements ControlPlaneService.
func (s *Service) CreateSession(ctx context.Context, req *connect.Request[cpv1.CreateSessionRequest]) (*connect.Response[cpv1.CreateSessionResponse], error) {
	m := req.Msg
	var tried []*router.Agent
	for attempt := 1; ; attempt++ {
		a, err := s.choose(ctx, m.GetSessionId(), m.GetRoute().GetLabels(), tried)
		if err != nil {
			return nil, err
		}
		res, err := a.Client.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{
			Language:    m.GetLanguage(),
			SessionId:   m.GetSessionId(),
			IdleTimeout: m.GetIdleTimeout(),
		}))
		if err == nil {
			sess := res.Msg.GetSession()
			s.router.Bind(sess.GetId(), a)
			return connect.NewResponse(&cpv1.CreateSessionResponse{Session: sess}), nil
		}
		if !retryable(err) || attempt == maxAttempts || ctx.Err() != nil {
			return nil, err
		}
		tried = append(tried, a)
	}
}

// CloseSession implements ControlPlaneService. A session this control plane
// does not know (it may have restarted) is looked for on every agent.
func (s *Service) CloseSession(ctx context.Context, req *connect.Request[cpv1.CloseSessionRequest]) (*connect.Response[cpv1.CloseSessionResponse], error) {
	id := req.Msg.GetSessionId()
	err := s.onSession(ctx, id, func(a *router.Agent) error {
		_, err := a.Client.CloseSession(ctx, connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: id}))
		return err
	})
	s.router.Unbind(id)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cpv1.CloseSessionResponse{}), nil
}

// ListAgents implements ControlPlaneService.
func (s *Service) ListAgents(ctx context.Context, _ *connect.Request[cpv1.ListAgentsRequest]) (*connect.Response[cpv1.ListAgentsResponse], error) {
	var out []*cpv1.Agent
	for _, snap := range s.router.Agents() {
		out = append(out, &cpv1.Agent{
			Address:  snap.Address,
			Healthy:  snap.Healthy,
			Status:   snap.Status,
			InFlight: int32(snap.InFlight),
			Error:    snap.Error,
		})
	}
	return connect.NewResponse(&cpv1.ListAgentsResponse{Agents: out}), nil
}

// ListLanguages implements ControlPlaneService.
func (s *Service) ListLanguages(ctx context.Context, _ *connect.Request[cpv1.ListLanguagesRequest]) (*connect.Response[cpv1.ListLanguagesResponse], error) {
	seen := map[string]bool{}
	var langs []*executionv1.Language
	for _, snap := range s.router.Agents() {
		if !snap.Healthy {
			continue
		}
		for _, l := range snap.Status.GetLanguages() {
			if !seen[l.GetName()] {
				seen[l.GetName()] = true
				langs = append(langs, l)
			}
		}
	}
	slices.SortFunc(langs, func(a, b *executionv1.Language) int {
		switch {
		case a.GetName() < b.GetName():
			return -1
		case a.GetName() > b.GetName():
			return 1
		}
		return 0
	})
	return connect.NewResponse(&cpv1.ListLanguagesResponse{Languages: langs}), nil
}
