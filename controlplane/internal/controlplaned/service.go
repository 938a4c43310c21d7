package controlplaned

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/codemode-go/codemode/controlplane/internal/router"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/cluster"
	"github.com/codemode-go/codemode/internal/limits"
	"github.com/codemode-go/codemode/internal/telemetry"
)

// maxAttempts bounds how many agents one stateless run is offered to when
// agents turn it away before running it.
const maxAttempts = 3

// Service implements ControlPlaneService over a Router. It is the one code
// path behind both the Connect API and the original's POST /run.
type Service struct {
	router  *router.Router
	logger  *slog.Logger
	metrics *metrics // nil: none
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
// exists (see locate), else the best agent for the route. allowNew says
// whether the agent may open the session: not when the agent has confirmed
// it before, since then a session it does not know was lost, not new. A
// session known to have ended is not_found. A session that lives on an
// agent the route does not select is failed_precondition: running it there
// would ignore the route, and elsewhere it does not exist.
func (s *Service) choose(ctx context.Context, tenant, sessionID string, labels map[string]string, exclude []*router.Agent) (a *router.Agent, allowNew bool, err error) {
	if sessionID == "" {
		a, err := s.router.Pick(labels, exclude...)
		if err != nil {
			return nil, false, connect.NewError(connect.CodeUnavailable, err)
		}
		return a, false, nil
	}
	a, confirmed, err := s.locate(ctx, tenant, sessionID)
	if err != nil {
		return nil, false, err
	}
	if a == nil {
		var b router.Binding
		if a, b, err = s.router.PickSession(ctx, sessionID, tenant, labels); err != nil {
			if errors.Is(err, router.ErrSessionGone) {
				return nil, false, goneError(b.Gone, b.Ended)
			}
			return nil, false, s.unavailable(ctx, sessionID, err)
		}
		confirmed = b.Confirmed // bound already, through another replica
	}
	if !a.Matches(labels) {
		return nil, false, connect.NewError(connect.CodeFailedPrecondition,
			fmt.Errorf("the session lives on an agent that this request's route (labels %v) does not select; close it and open it again under the same route", labels))
	}
	return a, !confirmed, nil
}

// locate returns the agent holding tenant's session id and whether that
// agent has confirmed it, or a nil agent when none holds it. It asks the
// router, and when the router does not know the session (this control plane
// restarted, say) every agent at once (findSession). A session known to
// have ended is not_found with the reason.
func (s *Service) locate(ctx context.Context, tenant, id string) (a *router.Agent, confirmed bool, err error) {
	b, a, ok, err := s.router.Session(ctx, id)
	switch {
	case err != nil:
		return nil, false, s.unavailable(ctx, id, err)
	case ok && a == nil:
		return nil, false, goneError(b.Gone, b.Ended)
	case ok:
		return a, b.Confirmed, nil
	}
	found, err := s.findSession(ctx, tenant, id)
	if err != nil || found == nil {
		return nil, false, err
	}
	if err := s.router.Bind(ctx, id, tenant, found); err != nil {
		return nil, false, s.unavailable(ctx, id, err)
	}
	return found, true, nil
}

// unavailable returns err, a failure to choose an agent, for the caller, as
// unavailable. A failure of the session store is logged here and named
// without its detail.
func (s *Service) unavailable(ctx context.Context, sessionID string, err error) error {
	if errors.Is(err, router.ErrStoreUnavailable) {
		s.logger.WarnContext(ctx, "session store failed", "session_id", sessionID, "error", err)
		// Nothing started: another control plane, whose store answers,
		// may take the call.
		return cluster.MarkNotStarted(connect.NewError(connect.CodeUnavailable, errors.New("the session store is unavailable; try again")))
	}
	return connect.NewError(connect.CodeUnavailable, err)
}

// markGone records that session id ended. The call that learnt it has its
// answer whether or not the store takes it, so a failure is only logged.
func (s *Service) markGone(ctx context.Context, id string, reason executionv1.SessionNotFound_Reason, ended time.Time) {
	if err := s.router.MarkGone(ctx, id, reason, ended); err != nil {
		s.logger.WarnContext(ctx, "record the end of a session", "session_id", id, "reason", reason, "error", err)
	}
}

// bind records that agent a holds tenant's session id. The call that showed
// it has succeeded and must not be made again, so a failure is only logged:
// the session stays bound to a, unconfirmed.
func (s *Service) bind(ctx context.Context, id, tenant string, a *router.Agent) {
	if err := s.router.Bind(ctx, id, tenant, a); err != nil {
		s.logger.WarnContext(ctx, "record a session's agent", "session_id", id, "agent", a.Address, "error", err)
	}
}

// findSessionTimeout bounds the search for a session on every agent.
const findSessionTimeout = 2 * time.Second

// findSession asks every agent, at once, whether it holds tenant's session
// id, and returns the one that does, or nil. An agent that knows the session
// ended makes it not_found with the reason. An agent that does not answer in
// time is taken not to hold it.
func (s *Service) findSession(ctx context.Context, tenant, id string) (*router.Agent, error) {
	ctx, cancel := context.WithTimeout(ctx, findSessionTimeout)
	defer cancel()
	agents := s.router.All()
	type answer struct {
		a   *router.Agent
		err error
	}
	found := make(chan answer, len(agents))
	for _, a := range agents {
		go func() {
			_, err := a.Client.GetSession(ctx, connect.NewRequest(&agentv1.GetSessionRequest{SessionId: id, Tenant: tenant}))
			switch {
			case err == nil:
				found <- answer{a: a}
				return
			case connect.CodeOf(err) == connect.CodeNotFound:
				if r := notFoundReason(err); r != executionv1.SessionNotFound_REASON_UNKNOWN && r != executionv1.SessionNotFound_REASON_UNSPECIFIED {
					found <- answer{err: err}
					return
				}
			default:
				s.logger.Debug("look for session", "agent", a.Address, "error", err)
			}
			found <- answer{}
		}()
	}
	var gone error
	for range agents {
		ans := <-found
		if ans.a != nil {
			return ans.a, nil
		}
		if ans.err != nil && gone == nil {
			gone = ans.err
		}
	}
	if gone != nil {
		return nil, s.sessionError(ctx, id, false, gone)
	}
	return nil, nil
}

// sessionError records what err, an agent's answer to a call on session
// id, says of the session, and returns the error for the caller. A session
// the agent had confirmed (confirmed) and no longer knows was lost with it.
func (s *Service) sessionError(ctx context.Context, id string, confirmed bool, err error) error {
	gone, ok := sessionNotFound(err)
	if connect.CodeOf(err) != connect.CodeNotFound || !ok {
		return err // not about the session: a file that is not there, say
	}
	switch gone.GetReason() {
	case executionv1.SessionNotFound_REASON_CLOSED, executionv1.SessionNotFound_REASON_EXPIRED, executionv1.SessionNotFound_REASON_LOST:
		s.markGone(ctx, id, gone.GetReason(), gone.GetEndTime().AsTime())
		return err
	}
	if confirmed {
		now := time.Now()
		s.markGone(ctx, id, executionv1.SessionNotFound_REASON_LOST, now)
		return goneError(executionv1.SessionNotFound_REASON_LOST, now)
	}
	return err
}

// goneError is the not_found error of a session that ended.
func goneError(reason executionv1.SessionNotFound_Reason, ended time.Time) error {
	what := map[executionv1.SessionNotFound_Reason]string{
		executionv1.SessionNotFound_REASON_CLOSED:  "was closed",
		executionv1.SessionNotFound_REASON_EXPIRED: "expired after its idle timeout",
		executionv1.SessionNotFound_REASON_LOST:    "was lost with its agent",
	}[reason]
	if what == "" {
		what = "does not exist"
	}
	err := connect.NewError(connect.CodeNotFound, fmt.Errorf("the session %s", what))
	gone := &executionv1.SessionNotFound{Reason: reason}
	if !ended.IsZero() {
		gone.EndTime = timestamppb.New(ended)
	}
	if d, derr := connect.NewErrorDetail(gone); derr == nil {
		err.AddDetail(d)
	}
	return err
}

// sessionNotFound returns the SessionNotFound detail of err, if any.
func sessionNotFound(err error) (*executionv1.SessionNotFound, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil, false
	}
	for _, d := range ce.Details() {
		if v, derr := d.Value(); derr == nil {
			if gone, ok := v.(*executionv1.SessionNotFound); ok {
				return gone, true
			}
		}
	}
	return nil, false
}

func notFoundReason(err error) executionv1.SessionNotFound_Reason {
	gone, _ := sessionNotFound(err)
	return gone.GetReason()
}

// agentError returns err, from a call to agent a, for the caller. An error
// that the agent did not send (it could not be reached) names no address:
// the detail goes to the log.
func (s *Service) agentError(a *router.Agent, reqID string, err error) error {
	if err == nil || connect.IsWireError(err) {
		return err
	}
	switch connect.CodeOf(err) {
	case connect.CodeUnavailable, connect.CodeUnknown, connect.CodeInternal:
	default:
		if !cluster.NotStarted(err) { // a dial that timed out is unreachable too
			return err // made here, or the caller's deadline
		}
	}
	s.logger.Warn("agent unreachable", "agent", a.Address, "request_id", reqID, "error", err)
	return connect.NewError(connect.CodeUnavailable, errors.New("an agent could not be reached; try again"))
}

// failureLevel is the log level of a failed call to an agent: refusals the
// caller caused are debug, the rest warnings.
func failureLevel(err error) slog.Level {
	switch connect.CodeOf(err) {
	case connect.CodeNotFound, connect.CodeInvalidArgument, connect.CodeCanceled, connect.CodeFailedPrecondition, connect.CodeAlreadyExists:
		return slog.LevelDebug
	}
	return slog.LevelWarn
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
	start, reqID := time.Now(), requestID(req.Msg.GetRequestId())
	res, err := s.forward(ctx, req.Msg.GetTenant(), req.Msg.GetExecution(), req.Msg.GetEgress(), req.Msg.GetRoute().GetLabels(), reqID)
	s.logExecution(ctx, "rpc", reqID, req.Msg.GetTenant(), req.Msg.GetExecution(), res, err, start)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cpv1.ExecuteResponse{Result: res}), nil
}

// execute runs ex for the seed door, which, being a door, checks the
// language itself (see docs/design.md, "Request path").
func (s *Service) execute(ctx context.Context, tenant string, ex *executionv1.Execution, eg *executionv1.Egress, labels map[string]string, reqID string) (*executionv1.Result, error) {
	if err := s.checkLanguage(ex.GetLanguage()); err != nil {
		return nil, err
	}
	return s.forward(ctx, tenant, ex, eg, labels, reqID)
}

// forward routes ex to an agent and returns its result. The edge has
// validated ex, canonicalised its language and set its timeout; the agent
// checks them again as invariants. The control plane decides only where the
// run goes.
func (s *Service) forward(ctx context.Context, tenant string, ex *executionv1.Execution, eg *executionv1.Egress, labels map[string]string, reqID string) (*executionv1.Result, error) {
	var out *executionv1.Result
	err := s.offer(ctx, call{what: "execute", tenant: tenant, sessionID: ex.GetSessionId(), labels: labels, requestID: reqID},
		func(a *router.Agent, allowNew bool) (bool, error) {
			release := a.Acquire()
			defer release()
			res, err := a.Client.Execute(ctx, connect.NewRequest(&agentv1.ExecuteRequest{Execution: ex, Egress: eg, RequestId: reqID, Tenant: tenant, AllowNewSession: allowNew}))
			if err != nil {
				return !cluster.NotStarted(err), err
			}
			out = res.Msg.GetResult()
			return false, nil
		})
	return out, err
}

// call describes a call that offer makes to agents.
type call struct {
	what      string // for logs
	tenant    string
	sessionID string // "" for a stateless run or a new session named by the agent
	labels    map[string]string
	requestID string
}

// offer makes a call on the agent that choose gives, and, when that agent
// certainly did not start it (no connection reached it, or it turned the
// call away: cluster.NotStarted) and the failure is retryable, on another,
// up to maxAttempts agents in all. A call that may have started there (try
// reports started: a connection broke mid-call, or part of the answer went
// to the caller) is never made again, so no run runs twice. A call on a
// session is made once, on the session's agent. An agent whose connection
// fails leaves routing until it answers again. Whatever the agents say of the session is
// recorded (sessionError), and the error returned is the caller's.
func (s *Service) offer(ctx context.Context, c call, try func(a *router.Agent, allowNew bool) (started bool, err error)) error {
	var tried []*router.Agent
	for attempt := 1; ; attempt++ {
		a, allowNew, err := s.route(ctx, c, tried, attempt)
		if err != nil {
			return err
		}
		started, err := try(a, allowNew)
		if err == nil {
			if c.sessionID != "" && allowNew {
				s.bind(ctx, c.sessionID, c.tenant, a) // confirmed now
			}
			return nil
		}
		if c.sessionID != "" && connect.IsWireError(err) {
			err = s.sessionError(ctx, c.sessionID, !allowNew, err)
		}
		err = s.agentError(a, c.requestID, err)
		s.logger.Log(ctx, failureLevel(err), "agent "+c.what+" failed", "agent", a.Address, "request_id", c.requestID, "session_id", c.sessionID, "attempt", attempt, "error", err)
		if connect.CodeOf(err) == connect.CodeUnavailable && ctx.Err() == nil && !connect.IsWireError(err) {
			a.MarkDown(err)
		}
		if started || c.sessionID != "" || !retryable(err) || attempt == maxAttempts || ctx.Err() != nil {
			return err
		}
		tried = append(tried, a)
	}
}

// route is choose for the attempt-th try of c, recorded in metrics and in
// a "route" span naming the agent chosen.
func (s *Service) route(ctx context.Context, c call, tried []*router.Agent, attempt int) (*router.Agent, bool, error) {
	ctx, span := telemetry.StartSpan(ctx, "route",
		attribute.String("codemode.call", c.what),
		telemetry.AttrSession.Bool(c.sessionID != ""),
		attribute.Int("codemode.attempt", attempt))
	a, allowNew, err := s.choose(ctx, c.tenant, c.sessionID, c.labels, tried)
	s.metrics.route(c.sessionID, err)
	if err == nil && span.IsRecording() {
		span.SetAttributes(telemetry.AttrAgent.String(a.Address))
	}
	telemetry.EndSpan(span, err)
	return a, allowNew, err
}

// ExecuteStream implements ControlPlaneService.
func (s *Service) ExecuteStream(ctx context.Context, req *connect.Request[cpv1.ExecuteStreamRequest], stream *connect.ServerStream[cpv1.ExecuteStreamResponse]) error {
	start, reqID := time.Now(), requestID(req.Msg.GetRequestId())
	var res *executionv1.Result
	err := s.executeStream(ctx, req.Msg.GetTenant(), req.Msg.GetExecution(), req.Msg.GetEgress(), req.Msg.GetRoute().GetLabels(), reqID,
		func(ev *executionv1.Event) error {
			if r := ev.GetResult(); r != nil {
				res = r
			}
			return stream.Send(&cpv1.ExecuteStreamResponse{Event: ev})
		})
	s.logExecution(ctx, "rpc", reqID, req.Msg.GetTenant(), req.Msg.GetExecution(), res, err, start)
	return err
}

// logExecution writes the control plane's line about one execution.
func (s *Service) logExecution(ctx context.Context, door, reqID, tenant string, ex *executionv1.Execution, res *executionv1.Result, err error, start time.Time) {
	if err == nil && res == nil {
		err = errors.New("no result")
	}
	e := telemetry.Execution{
		RequestID: reqID,
		Tenant:    tenant,
		Door:      door,
		Language:  ex.GetLanguage(),
		SessionID: ex.GetSessionId(),
		Result:    res,
		Err:       err,
		Elapsed:   time.Since(start),
	}
	e.Trace(ctx)
	e.Log(ctx, s.logger)
	s.metrics.execution().ObserveExecution(&e)
}

func (s *Service) executeStream(ctx context.Context, tenant string, ex *executionv1.Execution, eg *executionv1.Egress, labels map[string]string, reqID string, send func(*executionv1.Event) error) error {
	return s.offer(ctx, call{what: "execute stream", tenant: tenant, sessionID: ex.GetSessionId(), labels: labels, requestID: reqID},
		func(a *router.Agent, allowNew bool) (bool, error) {
			req := &agentv1.ExecuteStreamRequest{Execution: ex, Egress: eg, RequestId: reqID, Tenant: tenant, AllowNewSession: allowNew}
			return s.streamFrom(ctx, a, req, send)
		})
}

// streamFrom relays one agent's stream; started reports whether the run may
// have started there: an event went on to the caller, or the stream failed
// otherwise than cluster.NotStarted.
func (s *Service) streamFrom(ctx context.Context, a *router.Agent, req *agentv1.ExecuteStreamRequest, send func(*executionv1.Event) error) (started bool, err error) {
	release := a.Acquire()
	defer release()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := a.Client.ExecuteStream(ctx, connect.NewRequest(req))
	if err != nil {
		return !cluster.NotStarted(err), err
	}
	defer st.Close()
	for st.Receive() {
		if err := send(st.Msg().GetEvent()); err != nil {
			return true, err
		}
		started = true
	}
	err = st.Err()
	return started || (err != nil && !cluster.NotStarted(err)), err
}

// CreateSession implements ControlPlaneService.
func (s *Service) CreateSession(ctx context.Context, req *connect.Request[cpv1.CreateSessionRequest]) (*connect.Response[cpv1.CreateSessionResponse], error) {
	m := req.Msg
	var out *executionv1.Session
	err := s.offer(ctx, call{what: "create session", tenant: m.GetTenant(), sessionID: m.GetSessionId(), labels: m.GetRoute().GetLabels()},
		func(a *router.Agent, _ bool) (bool, error) {
			res, err := a.Client.CreateSession(ctx, connect.NewRequest(&agentv1.CreateSessionRequest{
				Language:    m.GetLanguage(),
				SessionId:   m.GetSessionId(),
				IdleTimeout: m.GetIdleTimeout(),
				Tenant:      m.GetTenant(),
			}))
			if err != nil {
				return !cluster.NotStarted(err), err
			}
			out = res.Msg.GetSession()
			s.bind(ctx, out.GetId(), m.GetTenant(), a) // the agent names a session created without an id
			return false, nil
		})
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&cpv1.CreateSessionResponse{Session: out}), nil
}

// CloseSession implements ControlPlaneService. A session this control plane
// does not know (it may have restarted) is looked for on every agent.
func (s *Service) CloseSession(ctx context.Context, req *connect.Request[cpv1.CloseSessionRequest]) (*connect.Response[cpv1.CloseSessionResponse], error) {
	id := req.Msg.GetSessionId()
	err := s.onSession(ctx, id, req.Msg.GetTenant(), func(a *router.Agent) error {
		_, err := a.Client.CloseSession(ctx, connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: id, Tenant: req.Msg.GetTenant()}))
		return err
	})
	if err != nil {
		return nil, err
	}
	s.markGone(ctx, id, executionv1.SessionNotFound_REASON_CLOSED, time.Now())
	return connect.NewResponse(&cpv1.CloseSessionResponse{}), nil
}

// ListAgents implements ControlPlaneService.
func (s *Service) ListAgents(ctx context.Context, _ *connect.Request[cpv1.ListAgentsRequest]) (*connect.Response[cpv1.ListAgentsResponse], error) {
	var out []*cpv1.Agent
	for _, snap := range s.router.Agents() {
		out = append(out, &cpv1.Agent{
			Address:    snap.Address,
			Healthy:    snap.Healthy,
			Status:     snap.Status,
			InFlight:   int32(snap.InFlight),
			Error:      snap.Error,
			Registered: snap.Registered,
		})
	}
	return connect.NewResponse(&cpv1.ListAgentsResponse{Agents: out}), nil
}

// Heartbeat implements ControlPlaneService: the agent joins routing, or
// stays in it, at the address it gives.
func (s *Service) Heartbeat(ctx context.Context, req *connect.Request[cpv1.HeartbeatRequest]) (*connect.Response[cpv1.HeartbeatResponse], error) {
	addr := req.Msg.GetAddress()
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("address %q: want host:port", addr))
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("address %q is unspecified: advertise an address the control plane can reach (--advertise-addr)", addr))
	}
	interval := req.Msg.GetInterval().AsDuration()
	if interval <= 0 {
		interval = DefaultHeartbeatInterval
	}
	if err := s.router.Register(ctx, addr, req.Msg.GetStatus(), interval); err != nil {
		// This replica routes to the agent; the others may not know it.
		s.logger.WarnContext(ctx, "share a heartbeat", "agent", addr, "error", err)
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the heartbeat was not shared with the other control planes: the session store is unavailable"))
	}
	return connect.NewResponse(&cpv1.HeartbeatResponse{}), nil
}

// DefaultHeartbeatInterval is the interval assumed of a heartbeat that
// gives none.
const DefaultHeartbeatInterval = time.Second

// checkLanguage fails with invalid_argument, naming the valid languages,
// when no healthy agent lists name as a language or alias. With no healthy
// agent reporting languages nothing can be said, and the agent checks. Only
// the seed door asks: calls from the edge come checked.
func (s *Service) checkLanguage(name string) error {
	var names []string
	for _, snap := range s.router.Agents() {
		if !snap.Healthy {
			continue
		}
		for _, l := range snap.Status.GetLanguages() {
			if l.GetName() == name || slices.Contains(l.GetAliases(), name) {
				return nil
			}
			if !slices.Contains(names, l.GetName()) {
				names = append(names, l.GetName())
			}
		}
	}
	if len(names) == 0 {
		return nil
	}
	return connect.NewError(connect.CodeInvalidArgument, limits.UnknownLanguage(name, names))
}

// ListLanguages implements ControlPlaneService.
func (s *Service) ListLanguages(ctx context.Context, _ *connect.Request[cpv1.ListLanguagesRequest]) (*connect.Response[cpv1.ListLanguagesResponse], error) {
	seen := map[string]bool{}
	var langs []*executionv1.Language
	var defaults *executionv1.Defaults
	for _, snap := range s.router.Agents() {
		if !snap.Healthy {
			continue
		}
		defaults = merge(defaults, snap.Status.GetDefaults())
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
	return connect.NewResponse(&cpv1.ListLanguagesResponse{Languages: langs, Defaults: defaults}), nil
}

// merge returns the defaults that both a (nil: none yet) and b honour: a's
// defaults, and the smaller of each maximum.
func merge(a, b *executionv1.Defaults) *executionv1.Defaults {
	switch {
	case b == nil:
		return a
	case a == nil:
		return proto.CloneOf(b)
	}
	if b.GetMaxTimeout().AsDuration() < a.GetMaxTimeout().AsDuration() {
		a.MaxTimeout = b.GetMaxTimeout()
	}
	a.MaxMemoryBytes = min(a.GetMaxMemoryBytes(), b.GetMaxMemoryBytes())
	a.MaxOutputBytes = min(a.GetMaxOutputBytes(), b.GetMaxOutputBytes())
	return a
}
