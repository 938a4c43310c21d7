package policy

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"github.com/codemode-go/codemode/internal/limits"
	"github.com/codemode-go/codemode/internal/telemetry"
)

// ReasonUnavailable is the reason of a denial by a policy that failed and
// fails closed.
const ReasonUnavailable = "policy_unavailable"

// Limits on what a decision may carry.
const (
	maxReasonBytes     = 1024
	maxAnnotations     = 16
	maxAnnotationKey   = 63
	maxAnnotationValue = 256
	maxCodeBytes       = limits.MaxCodeBytes
	maxStdinBytes      = limits.MaxStdinBytes
)

// ErrClosed is returned by evaluations after [Engine.Close].
var ErrClosed = errors.New("policy engine closed")

// Denial is the error of a request or result refused by a policy.
type Denial struct {
	// Policy is the configured name of the policy that refused.
	Policy string
	// Reason is shown to the caller; [ReasonUnavailable] when the policy failed.
	Reason string
	// Cause tells a decision from a failure.
	Cause policyv1.Cause
	// RequestID of the request refused.
	RequestID string
}

func (d *Denial) Error() string {
	return fmt.Sprintf("denied by policy %s: %s", d.Policy, d.Reason)
}

// Detail returns the denial as its protobuf message.
func (d *Denial) Detail() *policyv1.Denial {
	return &policyv1.Denial{Policy: d.Policy, Reason: d.Reason, Cause: d.Cause, RequestId: d.RequestID}
}

// ConnectError returns the denial as a Connect permission_denied error with
// a policyv1.Denial detail. Handlers call it; nothing below them does.
func (d *Denial) ConnectError() *connect.Error {
	err := connect.NewError(connect.CodePermissionDenied, d)
	if detail, derr := connect.NewErrorDetail(d.Detail()); derr == nil {
		err.AddDetail(detail)
	}
	return err
}

// decision is what the decisions of both phases have in common.
type decision interface {
	proto.Message
	GetVerdict() policyv1.Verdict
	GetReason() string
	GetAnnotations() map[string]string
}

// phase is one evaluation's state in the chain of its phase: it writes the
// input each policy sees, and checks and applies their decisions.
type phase[D decision] interface {
	// encode appends the next policy's input to b, with the annotations
	// the chain's policies have set so far.
	encode(b []byte, annotations map[string]string) ([]byte, error)
	// check validates a decision, allowing or denying; an error makes it
	// an invalid decision.
	check(d D) error
	// apply applies an allowed decision of m and reports whether the next
	// policy's input changed.
	apply(m *module, d D) (changed bool)
}

// chain is what an evaluation tells runChain besides its phase.
type chain struct {
	phase             string // "request" or "result", for spans
	requestID, tenant string
	// denied, followed by the policy's name, is the reason of a deny that
	// gives none; logDenied is the message that logs a deny.
	denied, logDenied string
	// annotationsInInput: later policies see the chain's annotations, so
	// new ones change their input.
	annotationsInInput bool
	// onCall, if set, gets a report of every call ([Options.OnCall]).
	onCall func(CallReport)
}

// runChain runs the policies mods in order, as both phases do: it encodes
// the input again only when it changed, calls each policy, checks its
// decision and counts it (and, with [Metrics], times it). The first deny,
// or the first failure of a policy that fails closed, ends the chain with a
// [*Denial]; a policy that fails open is skipped; an allowed decision is
// applied, and its annotations are added to the ones it returns. A
// cancelled ctx ends the chain with ctx's error.
func runChain[T any, D interface {
	*T
	decision
}](ctx context.Context, mods []*module, c chain, p phase[D]) (map[string]string, error) {
	var (
		input       []byte
		dirty       = true
		annotations map[string]string
	)
	for _, m := range mods {
		if dirty {
			var err error
			if input, err = p.encode(input[:0], annotations); err != nil {
				return nil, fmt.Errorf("encode policy input: %w", err)
			}
			dirty = false
		}
		d := D(new(T))
		start := time.Now()
		span := m.startSpan(ctx, c.phase)
		used, err := m.callFuel(ctx, input, func(b []byte) error { return unmarshalStrict(b, d) })
		if err == nil {
			if err = p.check(d); err != nil {
				m.counters.invalid.Add(1)
			}
		}
		if c.onCall != nil {
			r := CallReport{Policy: m.cfg.Name, Phase: c.phase, Fuel: used,
				FuelBudget: m.fuelBudget(len(input)), Duration: time.Since(start), Err: err}
			if err == nil || errors.Is(err, errInvalid) {
				r.Decision = d
			}
			c.onCall(r)
		}
		if err != nil {
			if ctx.Err() != nil {
				endSpan(span, "canceled")
				m.metrics.observe(outcomeCancelled, time.Since(start))
				return nil, ctx.Err()
			}
			if denial := m.failed(err, c.requestID); denial != nil {
				endSpan(span, "failed_closed")
				m.metrics.observe(outcomeFailClosed, time.Since(start))
				return nil, denial
			}
			endSpan(span, "failed_open")
			m.metrics.observe(outcomeFailOpen, time.Since(start))
			continue
		}
		if d.GetVerdict() == policyv1.Verdict_VERDICT_DENY {
			endSpan(span, "deny")
			m.counters.denied.Add(1)
			m.metrics.observe(outcomeDeny, time.Since(start))
			reason := d.GetReason()
			if reason == "" {
				reason = c.denied + m.cfg.Name
			}
			m.logger.Info(c.logDenied, "request_id", c.requestID, "tenant", c.tenant, "reason", reason)
			return nil, &Denial{Policy: m.cfg.Name, Reason: reason, Cause: policyv1.Cause_CAUSE_DENIED, RequestID: c.requestID}
		}
		endSpan(span, "allow")
		m.counters.allowed.Add(1)
		o := outcomeAllow
		if p.apply(m, d) {
			dirty, o = true, outcomeRewrite
		}
		m.metrics.observe(o, time.Since(start))
		if a := d.GetAnnotations(); len(a) > 0 {
			if annotations == nil {
				annotations = make(map[string]string, len(a))
			}
			maps.Copy(annotations, a)
			dirty = dirty || c.annotationsInInput
		}
	}
	return annotations, nil
}

// startSpan starts the span of one call of m in phase, "policy NAME",
// when ctx is traced; nil otherwise, at no cost beyond a context lookup.
func (m *module) startSpan(ctx context.Context, phase string) trace.Span {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return nil
	}
	_, span := telemetry.StartSpan(ctx, "policy "+m.cfg.Name,
		attribute.String("codemode.policy", m.cfg.Name), attribute.String("codemode.policy.phase", phase))
	return span
}

// endSpan ends a span of startSpan with the call's decision: allow, deny,
// failed_open, failed_closed or canceled. Never the decision's reason,
// which a policy may have made from the code.
func endSpan(span trace.Span, decision string) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.String("codemode.policy.decision", decision))
	span.End()
}

// failed accounts for a failed call and returns the denial when the policy
// fails closed, or nil when it fails open.
func (m *module) failed(err error, requestID string) *Denial {
	if m.cfg.FailureMode == FailOpen {
		m.counters.failedOpen.Add(1)
		m.logger.Warn("policy failed open", "request_id", requestID, "error", err)
		return nil
	}
	m.logger.Warn("policy failed closed", "request_id", requestID, "error", err)
	return &Denial{Policy: m.cfg.Name, Reason: ReasonUnavailable, Cause: policyv1.Cause_CAUSE_POLICY_UNAVAILABLE, RequestID: requestID}
}

// unmarshalStrict decodes b into msg, refusing unknown fields anywhere: a
// decision may only say what ABI v1 lets it say.
func unmarshalStrict(b []byte, msg proto.Message) error {
	if err := proto.Unmarshal(b, msg); err != nil {
		return err
	}
	if hasUnknown(msg.ProtoReflect()) {
		return errors.New("decision has fields ABI v1 does not define")
	}
	return nil
}

// hasUnknown reports whether m or any message within it has fields
// its type does not define. It walks the descriptor rather than calling
// m.Range, whose callback would cost an allocation per message.
func hasUnknown(m protoreflect.Message) bool {
	if len(m.GetUnknown()) > 0 {
		return true
	}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !m.Has(fd) {
			continue
		}
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				continue
			}
			found := false
			m.Get(fd).Map().Range(func(_ protoreflect.MapKey, v protoreflect.Value) bool {
				found = hasUnknown(v.Message())
				return !found
			})
			if found {
				return true
			}
		case fd.IsList():
			if fd.Message() == nil {
				continue
			}
			for l, j := m.Get(fd).List(), 0; j < l.Len(); j++ {
				if hasUnknown(l.Get(j).Message()) {
					return true
				}
			}
		case fd.Message() != nil:
			if hasUnknown(m.Get(fd).Message()) {
				return true
			}
		}
	}
	return false
}

func checkAnnotations(a map[string]string) error {
	if len(a) > maxAnnotations {
		return fmt.Errorf("%w: more than %d annotations", errInvalid, maxAnnotations)
	}
	for k, v := range a {
		if k == "" || len(k) > maxAnnotationKey || len(v) > maxAnnotationValue {
			return fmt.Errorf("%w: annotation key must be 1 to %d bytes and value at most %d",
				errInvalid, maxAnnotationKey, maxAnnotationValue)
		}
	}
	return nil
}
