package policy

import (
	"context"
	"fmt"
	"regexp"
	"time"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"github.com/codemode-go/codemode/internal/egressrule"
	"github.com/codemode-go/codemode/internal/limits"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// RequestInput is what the edge knows of a request before routing it.
type RequestInput struct {
	// Execution as the caller sent it. It is not modified.
	Execution *executionv1.Execution
	// Tenant from the caller's API key; "anonymous" when none.
	Tenant string
	// Door: "connect", "grpc", "grpcweb", "mcp", ...
	Door string
	// RequestID identifies the request in logs.
	RequestID string
	// Egress is what the run may reach outside its sandbox before the
	// policies narrow it: the tenant's configuration. Nil: nothing. Its
	// zero limits are the agent's defaults, which a policy's limit
	// replaces (see RATIONALE.md). It is not modified.
	Egress *executionv1.Egress
	// APICall is set when the request is a call of a declared API tool
	// (door "mcp-api") rather than a run; policies see it as is.
	APICall *policyv1.ApiCall
	// Subject is the hash of the caller's token subject; "" for API keys.
	Subject string
}

// RequestVerdict is the outcome of an allowed request.
type RequestVerdict struct {
	// Execution to run: the input's, or a rewritten and tightened copy.
	Execution *executionv1.Execution
	// Route holds the agent labels the run must go to; nil when no policy
	// routed it.
	Route map[string]string
	// Annotations set by the policies, for logs and the result phase.
	Annotations map[string]string
	// Egress is what the run may reach: the input's egress as the policies
	// narrowed it, or the input's own message when none set egress. Nil:
	// nothing. The edge sends it on with the run.
	Egress *executionv1.Egress
	// Generation that evaluated the request (0: no policies loaded).
	Generation uint64
}

// EvaluateRequest runs the request-phase chain on in. It returns a
// [*Denial] when a policy denies (or fails closed), ErrClosed after Close,
// or the context's error; otherwise the verdict says what to run and where.
//
// Each policy sees the execution as rewritten by the ones before it, and the
// egress as they narrowed it. Any deny wins; limits combine by minimum;
// route labels set by several policies go to the highest route_priority,
// then to the earliest policy; each decision's egress narrows the egress so
// far to what both allow (see egressrule.Narrow): a policy can take egress
// away, never add it.
func (e *Engine) EvaluateRequest(ctx context.Context, in RequestInput) (RequestVerdict, error) {
	g := e.acquire()
	defer g.release()
	if g.shut {
		return RequestVerdict{}, ErrClosed
	}
	if len(g.request) == 0 {
		return RequestVerdict{Execution: in.Execution, Egress: in.Egress, Generation: g.id}, nil
	}
	ceiling := effectiveLimits(in.Execution, time.Duration(g.cfg.DefaultTimeout))
	p := &requestPhase{
		e: e, g: g, ceiling: ceiling, limits: ceiling,
		v:   RequestVerdict{Execution: in.Execution, Egress: in.Egress, Generation: g.id},
		msg: &policyv1.RequestInput{Tenant: in.Tenant, Door: in.Door, RequestId: in.RequestID, ApiCall: in.APICall, Subject: in.Subject},
	}
	c := chain{
		phase:     "request",
		requestID: in.RequestID, tenant: in.Tenant,
		denied: "denied by policy ", logDenied: "request denied by policy",
		annotationsInInput: true,
		onCall:             e.opts.OnCall,
	}
	annotations, err := runChain[policyv1.RequestDecision](ctx, g.request, c, p)
	if err != nil {
		return RequestVerdict{}, err
	}
	p.v.Annotations = annotations
	return p.v, nil
}

// requestPhase is one request's state in the request chain.
type requestPhase struct {
	e       *Engine
	g       *generation
	v       RequestVerdict // so far
	msg     *policyv1.RequestInput
	cloned  bool // v.Execution is the evaluation's own copy
	ceiling limitSet
	limits  limitSet
	prio    map[string]int32 // route_priority of each route label set
}

func (p *requestPhase) encode(b []byte, annotations map[string]string) ([]byte, error) {
	p.msg.Execution, p.msg.Annotations, p.msg.Egress = p.v.Execution, annotations, p.v.Egress
	return (proto.MarshalOptions{}).MarshalAppend(b, p.msg)
}

func (p *requestPhase) check(d *policyv1.RequestDecision) error {
	return p.e.validateRequest(p.g, d, p.ceiling)
}

func (p *requestPhase) apply(m *module, d *policyv1.RequestDecision) (changed bool) {
	v := &p.v
	if rw := d.Rewrite; rw != nil && (rw.Code != nil || rw.Language != nil || rw.Stdin != nil) {
		p.own()
		if rw.Code != nil {
			v.Execution.Code = rw.GetCode()
		}
		if rw.Language != nil {
			v.Execution.Language = rw.GetLanguage()
		}
		if rw.Stdin != nil {
			v.Execution.Stdin = rw.Stdin
		}
		changed = true
	}
	tighter := false
	if l := d.Limits; l != nil {
		if t := l.Timeout.AsDuration(); l.Timeout != nil && t > 0 && t < p.limits.timeout {
			p.limits.timeout, tighter = t, true
		}
		if l.MemoryBytes != 0 && (p.limits.memory == 0 || l.MemoryBytes < p.limits.memory) {
			p.limits.memory, tighter = l.MemoryBytes, true
		}
		if l.OutputBytes != 0 && (p.limits.output == 0 || l.OutputBytes < p.limits.output) {
			p.limits.output, tighter = l.OutputBytes, true
		}
	}
	if tighter {
		p.own()
		p.limits.apply(v.Execution, p.ceiling)
		changed = true
	}
	for k, val := range d.Route {
		if prio, ok := p.prio[k]; ok && d.RoutePriority <= prio {
			continue
		}
		if v.Route == nil {
			v.Route, p.prio = make(map[string]string), make(map[string]int32)
		}
		v.Route[k], p.prio[k] = val, d.RoutePriority
	}
	if d.Egress != nil {
		var dropped []string
		v.Egress, dropped = egressrule.Narrow(v.Egress, d.Egress)
		if len(dropped) > 0 {
			m.logger.Debug("policy asked for egress the run does not have; narrowed",
				"request_id", p.msg.RequestId, "dropped", dropped)
		}
		changed = true
	}
	return changed
}

// own makes the verdict's execution a copy that the evaluation may change;
// the caller's is never modified.
func (p *requestPhase) own() {
	if !p.cloned {
		p.v.Execution, p.cloned = proto.CloneOf(p.v.Execution), true
	}
}

// limitSet is the effective limits of an execution; 0 memory or output means
// the agent's default, which any value tightens.
type limitSet struct {
	timeout        time.Duration
	memory, output uint64
}

func effectiveLimits(x *executionv1.Execution, defaultTimeout time.Duration) limitSet {
	l := limitSet{timeout: defaultTimeout}
	if t := x.GetTimeout(); t != nil && t.AsDuration() > 0 {
		l.timeout = t.AsDuration()
	}
	l.memory = x.GetLimits().GetMemoryBytes()
	l.output = x.GetLimits().GetOutputBytes()
	return l
}

// apply writes the tightened limits into x.
func (l limitSet) apply(x *executionv1.Execution, ceiling limitSet) {
	if l.timeout < ceiling.timeout {
		x.Timeout = durationpb.New(l.timeout)
	}
	if l.memory != ceiling.memory || l.output != ceiling.output {
		if x.Limits == nil {
			x.Limits = &executionv1.Limits{}
		}
		x.Limits.MemoryBytes, x.Limits.OutputBytes = l.memory, l.output
	}
}

// validateRequest checks a decision against ABI v1 and the edge's rules.
func (e *Engine) validateRequest(g *generation, d *policyv1.RequestDecision, ceiling limitSet) error {
	switch d.Verdict {
	case policyv1.Verdict_VERDICT_ALLOW, policyv1.Verdict_VERDICT_DENY:
	default:
		return fmt.Errorf("%w: verdict %v", errInvalid, d.Verdict)
	}
	if len(d.Reason) > maxReasonBytes {
		return fmt.Errorf("%w: reason longer than %d bytes", errInvalid, maxReasonBytes)
	}
	if err := checkAnnotations(d.Annotations); err != nil {
		return err
	}
	if d.Verdict == policyv1.Verdict_VERDICT_DENY {
		return nil // a deny's other fields are ignored
	}
	if rw := d.Rewrite; rw != nil {
		if rw.Code != nil && (len(rw.GetCode()) == 0 || len(rw.GetCode()) > maxCodeBytes) {
			return fmt.Errorf("%w: rewritten code must be 1 to %d bytes", errInvalid, maxCodeBytes)
		}
		if rw.Language != nil && !e.knownLanguage(rw.GetLanguage()) {
			return fmt.Errorf("%w: rewrite to unknown language %q", errInvalid, rw.GetLanguage())
		}
		if len(rw.Stdin) > maxStdinBytes {
			return fmt.Errorf("%w: rewritten stdin longer than %d bytes", errInvalid, maxStdinBytes)
		}
	}
	if l := d.Limits; l != nil {
		if l.Timeout != nil {
			if err := l.Timeout.CheckValid(); err != nil {
				return fmt.Errorf("%w: timeout: %w", errInvalid, err)
			}
			if t := l.Timeout.AsDuration(); t < 0 || t > ceiling.timeout {
				return fmt.Errorf("%w: timeout %v loosens the limit %v", errInvalid, t, ceiling.timeout)
			}
		}
		if ceiling.memory != 0 && l.MemoryBytes > ceiling.memory {
			return fmt.Errorf("%w: memory_bytes %d loosens the limit %d", errInvalid, l.MemoryBytes, ceiling.memory)
		}
		if ceiling.output != 0 && l.OutputBytes > ceiling.output {
			return fmt.Errorf("%w: output_bytes %d loosens the limit %d", errInvalid, l.OutputBytes, ceiling.output)
		}
	}
	if err := egressrule.ValidateEgress(d.Egress); err != nil {
		return fmt.Errorf("%w: egress: %w", errInvalid, err)
	}
	if len(d.Route) > 16 {
		return fmt.Errorf("%w: more than 16 route labels", errInvalid)
	}
	for k, v := range d.Route {
		values, known := g.labels[k]
		if !known {
			return fmt.Errorf("%w: route to unknown label %q", errInvalid, k)
		}
		if values != nil && !values[v] {
			return fmt.Errorf("%w: route to unknown value %q of label %q", errInvalid, v, k)
		}
	}
	return nil
}

// knownLanguage reports whether a rewrite may set the language name.
func (e *Engine) knownLanguage(name string) bool {
	if !languageName.MatchString(name) {
		return false
	}
	return e.opts.KnownLanguage == nil || e.opts.KnownLanguage(name)
}

// languageName is the form of a language name in the protos' rules.
var languageName = regexp.MustCompile(limits.LanguagePattern)
