// Package telemetry holds what the three services share to be observed:
// the outcome of a run as one short word, the one log line each service
// writes per execution, Prometheus metrics served on /metrics, and
// OpenTelemetry tracing.
//
// Everything here is safe for concurrent use.
package telemetry

import (
	"context"
	"log/slog"
	"time"

	"connectrpc.com/connect"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// Outcomes of a run that ended with a result. A run that ended with an
// error has the error's Connect code as its outcome ("unavailable",
// "resource_exhausted", ...), so that outcomes are a small fixed set, fit
// for a metric label.
const (
	OutcomeOK       = "ok"        // exited 0
	OutcomeExit     = "exit"      // exited with another status
	OutcomeTimedOut = "timed_out" // killed at its timeout
	OutcomeOOM      = "oom"       // killed at its memory limit
)

// Outcome returns the outcome of a run that returned res and err.
func Outcome(res *executionv1.Result, err error) string {
	switch {
	case err != nil:
		return connect.CodeOf(err).String()
	case res.GetTimedOut():
		return OutcomeTimedOut
	case res.GetOomKilled():
		return OutcomeOOM
	case res.GetExitCode() != 0:
		return OutcomeExit
	}
	return OutcomeOK
}

// Execution is what a service knows about one execution when it ends.
type Execution struct {
	RequestID string
	Tenant    string
	Subject   string // a hash of the caller's token subject; empty for none
	Door      string // empty where the service does not know it
	Language  string
	Agent     string // the agent that ran it, if any
	SessionID string
	Result    *executionv1.Result // nil when Err is set
	Err       error
	Elapsed   time.Duration // as this service saw it
}

// Outcome returns e's outcome (see Outcome).
func (e *Execution) Outcome() string { return Outcome(e.Result, e.Err) }

// Log writes e as the service's one info line about it, "execution", with
// stable keys: request_id, tenant, subject (when there is one), door, language, agent, session_id,
// outcome, exit_code, duration (the program's own, from its result) and
// elapsed (end to end in this service).
func (e *Execution) Log(ctx context.Context, log *slog.Logger) {
	attrs := make([]slog.Attr, 0, 11)
	attrs = append(attrs, slog.String("request_id", e.RequestID), slog.String("tenant", e.Tenant))
	if e.Subject != "" {
		attrs = append(attrs, slog.String("subject", e.Subject))
	}
	if e.Door != "" {
		attrs = append(attrs, slog.String("door", e.Door))
	}
	agent := e.Agent
	if agent == "" {
		agent = e.Result.GetAgent()
	}
	attrs = append(attrs, slog.String("language", e.Language), slog.String("agent", agent))
	if e.SessionID != "" {
		attrs = append(attrs, slog.String("session_id", e.SessionID))
	}
	attrs = append(attrs, slog.String("outcome", e.Outcome()))
	if e.Err == nil {
		attrs = append(attrs, slog.Int("exit_code", int(e.Result.GetExitCode())), slog.Duration("duration", e.Result.GetDuration().AsDuration()))
	}
	attrs = append(attrs, slog.Duration("elapsed", e.Elapsed))
	log.LogAttrs(ctx, slog.LevelInfo, "execution", attrs...)
}
