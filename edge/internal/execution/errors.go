package execution

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// publicError turns *errp, the error of a call of c about session (the id
// the caller sent; may be empty), into what a public caller may see, and
// logs it, once, with the request id. It is the edge's one mapping of
// errors to what callers see; every method of the Service defers it.
//
//   - A session that is not there is not_found, saying what became of it
//     (closed, expired, lost with its agent) and quoting the caller's id,
//     never the scoped id the cluster knows it by.
//   - A failure to reach the control plane (an error of the transport, not
//     one the control plane sent) is unavailable, and internal errors are
//     internal: in both, the detail (addresses, causes) goes only to the
//     log, and the caller gets the request id to report.
//   - Other errors keep their code and message, which the control plane
//     and the agents write for callers, with any scoped session id replaced
//     by the caller's.
func (s *Service) publicError(c Caller, session string, errp *error) {
	err := *errp
	if err == nil {
		return
	}
	out := s.public(c, session, err)
	*errp = out
	lvl := slog.LevelWarn
	switch connect.CodeOf(out) {
	case connect.CodeInvalidArgument, connect.CodeCanceled, connect.CodePermissionDenied, connect.CodeNotFound,
		connect.CodeResourceExhausted, connect.CodeAlreadyExists, connect.CodeFailedPrecondition:
		lvl = slog.LevelDebug
	}
	s.logger.Log(context.Background(), lvl, "request failed", "request_id", c.RequestID, "tenant", c.Tenant, "subject", c.Subject, "door", c.Door,
		"code", connect.CodeOf(out).String(), "error", err)
}

func (s *Service) public(c Caller, session string, err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("internal error (request id %s)", c.RequestID))
	}
	code := ce.Code()
	if !connect.IsWireError(err) {
		// Made here: by validation, a policy, the limits; or by the client
		// when the control plane could not be reached.
		switch {
		case code == connect.CodeUnavailable, code == connect.CodeUnknown, code == connect.CodeInternal, code == connect.CodeDataLoss, code == connect.CodeUnimplemented,
			// The client calls a connection reset canceled (taking it
			// for the caller going away); here it is the control plane
			// that went away, mid-call.
			code == connect.CodeCanceled && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)):
			return withMeta(connect.NewError(connect.CodeUnavailable, fmt.Errorf("codemode is unavailable; try again (request id %s)", c.RequestID)), ce)
		}
		return err
	}
	switch code {
	case connect.CodeNotFound:
		if gone, ok := sessionNotFound(err); ok && session != "" {
			out := connect.NewError(code, errors.New(goneMessage(session, gone)))
			if d, derr := connect.NewErrorDetail(gone); derr == nil {
				out.AddDetail(d)
			}
			return out
		}
	case connect.CodeUnknown, connect.CodeInternal, connect.CodeDataLoss, connect.CodeUnimplemented:
		return connect.NewError(connect.CodeInternal, fmt.Errorf("internal error (request id %s)", c.RequestID))
	case connect.CodeUnavailable:
		return withMeta(connect.NewError(code, fmt.Errorf("%s (request id %s)", ce.Message(), c.RequestID)), ce)
	}
	msg := ce.Message()
	if session != "" {
		msg = strings.ReplaceAll(msg, s.scoped(c.Tenant, session), session)
	}
	out := connect.NewError(code, errors.New(msg))
	for _, d := range ce.Details() {
		out.AddDetail(d)
	}
	return withMeta(out, ce)
}

// withMeta copies the Retry-After hint of from onto to.
func withMeta(to, from *connect.Error) *connect.Error {
	if v := from.Meta().Get("Retry-After"); v != "" {
		to.Meta().Set("Retry-After", v)
	}
	return to
}

// sessionNotFound returns the SessionNotFound detail of err, if it has one.
func sessionNotFound(err error) (*executionv1.SessionNotFound, bool) {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return nil, false
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if derr != nil {
			continue
		}
		if gone, ok := v.(*executionv1.SessionNotFound); ok {
			return gone, true
		}
	}
	return nil, false
}

// SessionNotFoundReason returns why err says a session is not there, or
// REASON_UNSPECIFIED when err is not about a missing session.
func SessionNotFoundReason(err error) executionv1.SessionNotFound_Reason {
	if connect.CodeOf(err) != connect.CodeNotFound {
		return executionv1.SessionNotFound_REASON_UNSPECIFIED
	}
	gone, ok := sessionNotFound(err)
	if !ok {
		return executionv1.SessionNotFound_REASON_UNSPECIFIED
	}
	return gone.GetReason()
}

// goneMessage says what became of session id.
func goneMessage(id string, gone *executionv1.SessionNotFound) string {
	when := ""
	if t := gone.GetEndTime(); t != nil {
		when = " at " + t.AsTime().UTC().Format(time.RFC3339)
	}
	switch gone.GetReason() {
	case executionv1.SessionNotFound_REASON_CLOSED:
		return fmt.Sprintf("session %q was closed%s; its files and state are gone: create a new session", id, when)
	case executionv1.SessionNotFound_REASON_EXPIRED:
		return fmt.Sprintf("session %q expired%s after its idle timeout passed without a run; its files and state are gone: create a new session", id, when)
	case executionv1.SessionNotFound_REASON_LOST:
		return fmt.Sprintf("session %q was lost%s with the agent that held it (the agent restarted or its sandbox died); its files and state are gone: create a new session", id, when)
	}
	return fmt.Sprintf("session %q does not exist: create one with CreateSession, or pass a new id to a run to open it", id)
}
