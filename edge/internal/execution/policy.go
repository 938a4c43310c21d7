package execution

import (
	"context"
	"errors"

	"github.com/codemode-go/codemode/edge/internal/policy"
	"github.com/codemode-go/codemode/edge/internal/tenant"
	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"google.golang.org/protobuf/proto"
)

// Option configures a Service.
type Option func(*Service)

// WithPolicies runs every execution through the request-phase policies of
// e (which may deny, rewrite, tighten limits and route it) and every result
// through its result-phase policies (which may withhold or redact it). A
// denial is a Connect permission_denied error with a policyv1.Denial detail
// naming the policy and reason.
func WithPolicies(e *policy.Engine) Option {
	return func(s *Service) { s.policies = e }
}

// WithEgress gives each tenant's runs the egress c configures (which the
// request-phase policies may narrow); without it, runs reach nothing
// outside their sandboxes.
func WithEgress(c *tenant.EgressConfig) Option {
	return func(s *Service) { s.egress = c }
}

// vetted is what the request phase decided.
type vetted struct {
	ex          *executionv1.Execution
	route       *cpv1.Route
	annotations map[string]string
	egress      *executionv1.Egress
}

// vetRequest runs the request-phase policies on ex.
func (s *Service) vetRequest(ctx context.Context, call Call, ex *executionv1.Execution) (vetted, error) {
	eg := s.egress.For(call.Tenant)
	if s.policies == nil {
		return vetted{ex: ex, egress: eg}, nil
	}
	v, err := s.policies.EvaluateRequest(ctx, policy.RequestInput{
		Execution: ex, Tenant: call.Tenant, Door: call.Door, RequestID: call.RequestID, Egress: eg, Subject: call.Subject,
	})
	if err != nil {
		return vetted{}, policyError(err)
	}
	out := vetted{ex: v.Execution, annotations: v.Annotations, egress: v.Egress}
	if out.ex.GetLanguage() != ex.GetLanguage() {
		// A rewrite may name an alias; the agents get the table's name.
		// (The engine let only names the table knows through.)
		if out.ex.Language, err = s.languages.canonical(ctx, out.ex.GetLanguage()); err != nil {
			return vetted{}, err
		}
	}
	if len(v.Route) > 0 {
		out.route = &cpv1.Route{Labels: v.Route}
	}
	return out, nil
}

// placeSession runs the request-phase policies for a session about to be
// opened for c in language (session id scopedID), so that sessions go where
// the runs in them will be routed: the chain sees an execution with that
// language and session id and no code. A denial refuses the session and the
// route places it; rewrites and limits are for runs and are not used here.
func (s *Service) placeSession(ctx context.Context, c Caller, language, scopedID string) (*cpv1.Route, error) {
	if s.policies == nil {
		return nil, nil
	}
	if c.RequestID == "" {
		c.RequestID = NewRequestID()
	}
	call := Call{Tenant: c.Tenant, Door: c.Door, RequestID: c.RequestID, Subject: c.Subject}
	v, err := s.vetRequest(ctx, call, &executionv1.Execution{Language: language, SessionId: scopedID})
	if err != nil {
		return nil, err
	}
	return v.route, nil
}

// vetResult runs the result-phase policies on r.
func (s *Service) vetResult(ctx context.Context, call Call, v vetted, r *executionv1.Result) (*executionv1.Result, error) {
	if s.policies == nil {
		return r, nil
	}
	out, err := s.policies.EvaluateResult(ctx, policy.ResultInput{
		Result: r, Tenant: call.Tenant, Door: call.Door, RequestID: call.RequestID,
		Language: v.ex.GetLanguage(), Annotations: v.annotations,
	})
	if err != nil {
		return nil, policyError(err)
	}
	return out.Result, nil
}

// policyError turns a denial into the error every door reports.
func policyError(err error) error {
	var d *policy.Denial
	if errors.As(err, &d) {
		return d.ConnectError()
	}
	return err
}

// holdsOutput reports whether a stream must hold its output back until the
// result policies have seen it (they may redact across chunk boundaries).
func (s *Service) holdsOutput() bool {
	return s.policies != nil && s.policies.HasResultPolicies()
}

// heldOutput wraps send so that output chunks are kept until the result
// arrives; the result policies then see the whole output, and the caller
// gets it (as redacted) in one stdout and one stderr event before the result.
// The agent's output limit bounds what is kept.
func (s *Service) heldOutput(ctx context.Context, call Call, v vetted, send func(*executionv1.Event) error) func(*executionv1.Event) error {
	var stdout, stderr []byte
	return func(ev *executionv1.Event) error {
		switch e := ev.GetEvent().(type) {
		case *executionv1.Event_Stdout:
			stdout = append(stdout, e.Stdout...)
			return nil
		case *executionv1.Event_Stderr:
			stderr = append(stderr, e.Stderr...)
			return nil
		case *executionv1.Event_Result:
			whole := proto.CloneOf(e.Result)
			whole.Stdout, whole.Stderr = string(stdout), string(stderr)
			r, err := s.vetResult(ctx, call, v, whole)
			if err != nil {
				return err
			}
			if r.GetStdout() != "" {
				if err := send(&executionv1.Event{Event: &executionv1.Event_Stdout{Stdout: r.GetStdout()}}); err != nil {
					return err
				}
			}
			if r.GetStderr() != "" {
				if err := send(&executionv1.Event{Event: &executionv1.Event_Stderr{Stderr: r.GetStderr()}}); err != nil {
					return err
				}
			}
			final := proto.CloneOf(r)
			final.Stdout, final.Stderr = "", ""
			return send(&executionv1.Event{Event: &executionv1.Event_Result{Result: final}})
		}
		return send(ev)
	}
}
