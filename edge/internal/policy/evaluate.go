package policy

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
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
	maxCodeBytes       = 262144
	maxStdinBytes      = 1 << 20
)

// ErrClosed is returned by evaluations after [Engine.Close].
var ErrClosed = errors.New("policy engine closed")

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
	// APICall is set, with door "mcp-api" and an empty Execution, when the
	// request is a call of a declared API tool that the edge makes itself.
	// Only a denial applies to it.
	APICall *policyv1.ApiCall
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
	// Generation that evaluated the request (0: no policies loaded).
	Generation uint64
}

// ResultInput is a run's result before it goes back to the caller.
type ResultInput struct {
	// Result of the run. It is not modified.
	Result      *executionv1.Result
	Tenant      string
	Door        string
	RequestID   string
	Language    string
	Annotations map[string]string
}

// ResultVerdict is the outcome of an allowed result.
type ResultVerdict struct {
	// Result to return: the input's, or a redacted copy.
	Result *executionv1.Result
	// Annotations set by result policies.
	Annotations map[string]string
	// Generation that evaluated the result.
	Generation uint64
}

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

// EvaluateRequest runs the request-phase chain on in. It returns a
// [*Denial] when a policy denies (or fails closed), ErrClosed after Close,
// or the context's error; otherwise the verdict says what to run and where.
//
// Each policy sees the execution as rewritten by the ones before it. Any
// deny wins; limits combine by minimum; route labels set by several policies
// go to the highest route_priority, then to the earliest policy.
func (e *Engine) EvaluateRequest(ctx context.Context, in RequestInput) (RequestVerdict, error) {
	g := e.acquire()
	defer g.release()
	if g.shut {
		return RequestVerdict{}, ErrClosed
	}
	v := RequestVerdict{Execution: in.Execution, Generation: g.id}
	if len(g.request) == 0 {
		return v, nil
	}
	ceiling := effectiveLimits(in.Execution, time.Duration(g.cfg.DefaultTimeout))
	var (
		input   []byte
		dirty   = true
		cloned  bool
		prio    map[string]int32
		limits  = ceiling
		tighter bool
	)
	msg := &policyv1.RequestInput{Tenant: in.Tenant, Door: in.Door, RequestId: in.RequestID, ApiCall: in.APICall}
	for _, m := range g.request {
		if dirty {
			msg.Execution, msg.Annotations = v.Execution, v.Annotations
			var err error
			if input, err = (proto.MarshalOptions{}).MarshalAppend(input[:0], msg); err != nil {
				return RequestVerdict{}, fmt.Errorf("encode policy input: %w", err)
			}
			dirty = false
		}
		var d policyv1.RequestDecision
		err := m.call(ctx, input, func(b []byte) error { return unmarshalStrict(b, &d) })
		if err == nil {
			err = e.validateRequest(g, &d, ceiling)
			if err != nil {
				m.counters.invalid.Add(1)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return RequestVerdict{}, ctx.Err()
			}
			if denial := m.failed(err, in.RequestID); denial != nil {
				return RequestVerdict{}, denial
			}
			continue
		}
		if d.Verdict == policyv1.Verdict_VERDICT_DENY {
			m.counters.denied.Add(1)
			reason := d.Reason
			if reason == "" {
				reason = "denied by policy " + m.cfg.Name
			}
			m.logger.Info("request denied by policy", "request_id", in.RequestID, "tenant", in.Tenant, "reason", reason)
			return RequestVerdict{}, &Denial{Policy: m.cfg.Name, Reason: reason, Cause: policyv1.Cause_CAUSE_DENIED, RequestID: in.RequestID}
		}
		m.counters.allowed.Add(1)
		if rw := d.Rewrite; rw != nil && (rw.Code != nil || rw.Language != nil || rw.Stdin != nil) {
			if !cloned {
				v.Execution, cloned = proto.CloneOf(v.Execution), true
			}
			if rw.Code != nil {
				v.Execution.Code = rw.GetCode()
			}
			if rw.Language != nil {
				v.Execution.Language = rw.GetLanguage()
			}
			if rw.Stdin != nil {
				v.Execution.Stdin = rw.Stdin
			}
			dirty = true
		}
		if l := d.Limits; l != nil {
			if t := l.Timeout.AsDuration(); l.Timeout != nil && t > 0 && t < limits.timeout {
				limits.timeout, tighter = t, true
			}
			if l.MemoryBytes != 0 && (limits.memory == 0 || l.MemoryBytes < limits.memory) {
				limits.memory, tighter = l.MemoryBytes, true
			}
			if l.OutputBytes != 0 && (limits.output == 0 || l.OutputBytes < limits.output) {
				limits.output, tighter = l.OutputBytes, true
			}
		}
		for k, val := range d.Route {
			if p, ok := prio[k]; ok && d.RoutePriority <= p {
				continue
			}
			if v.Route == nil {
				v.Route, prio = make(map[string]string), make(map[string]int32)
			}
			v.Route[k], prio[k] = val, d.RoutePriority
		}
		if len(d.Annotations) > 0 {
			if v.Annotations == nil {
				v.Annotations = make(map[string]string, len(d.Annotations))
			}
			for k, val := range d.Annotations {
				v.Annotations[k] = val
			}
			dirty = true
		}
		if tighter {
			if !cloned {
				v.Execution, cloned = proto.CloneOf(v.Execution), true
			}
			limits.apply(v.Execution, ceiling)
			tighter, dirty = false, true
		}
	}
	return v, nil
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
	if hasUnknown(msg) {
		return errors.New("decision has fields ABI v1 does not define")
	}
	return nil
}

func hasUnknown(msg proto.Message) bool {
	switch d := msg.(type) {
	case *policyv1.RequestDecision:
		return len(d.ProtoReflect().GetUnknown()) > 0 ||
			d.Rewrite != nil && len(d.Rewrite.ProtoReflect().GetUnknown()) > 0 ||
			d.Limits != nil && (len(d.Limits.ProtoReflect().GetUnknown()) > 0 ||
				d.Limits.Timeout != nil && len(d.Limits.Timeout.ProtoReflect().GetUnknown()) > 0)
	case *policyv1.ResultDecision:
		if len(d.ProtoReflect().GetUnknown()) > 0 {
			return true
		}
		for _, r := range d.Redactions {
			if len(r.ProtoReflect().GetUnknown()) > 0 {
				return true
			}
		}
	}
	return false
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

// EvaluateResult runs the result-phase chain on in. It returns a [*Denial]
// when a policy withholds the result (or fails closed), ErrClosed after
// Close, or the context's error; otherwise the verdict holds the result to
// return, redacted as the policies asked. Each policy sees the output as the
// ones before it left it.
func (e *Engine) EvaluateResult(ctx context.Context, in ResultInput) (ResultVerdict, error) {
	g := e.acquire()
	defer g.release()
	if g.shut {
		return ResultVerdict{}, ErrClosed
	}
	v := ResultVerdict{Result: in.Result, Generation: g.id}
	if len(g.result) == 0 {
		return v, nil
	}
	var (
		input  []byte
		dirty  = true
		cloned bool
	)
	msg := &policyv1.ResultInput{Tenant: in.Tenant, Door: in.Door, RequestId: in.RequestID, Language: in.Language, Annotations: in.Annotations}
	for _, m := range g.result {
		if dirty {
			msg.Result = v.Result
			var err error
			if input, err = (proto.MarshalOptions{}).MarshalAppend(input[:0], msg); err != nil {
				return ResultVerdict{}, fmt.Errorf("encode policy input: %w", err)
			}
			dirty = false
		}
		var d policyv1.ResultDecision
		err := m.call(ctx, input, func(b []byte) error { return unmarshalStrict(b, &d) })
		var stdout, stderr string
		if err == nil {
			stdout, stderr, err = applyResult(&d, v.Result)
			if err != nil {
				m.counters.invalid.Add(1)
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return ResultVerdict{}, ctx.Err()
			}
			if denial := m.failed(err, in.RequestID); denial != nil {
				return ResultVerdict{}, denial
			}
			continue
		}
		if d.Verdict == policyv1.Verdict_VERDICT_DENY {
			m.counters.denied.Add(1)
			reason := d.Reason
			if reason == "" {
				reason = "result withheld by policy " + m.cfg.Name
			}
			return ResultVerdict{}, &Denial{Policy: m.cfg.Name, Reason: reason, Cause: policyv1.Cause_CAUSE_DENIED, RequestID: in.RequestID}
		}
		m.counters.allowed.Add(1)
		if stdout != v.Result.GetStdout() || stderr != v.Result.GetStderr() {
			if !cloned {
				v.Result, cloned = proto.CloneOf(v.Result), true
			}
			v.Result.Stdout, v.Result.Stderr = stdout, stderr
			dirty = true
		}
		if len(d.Annotations) > 0 {
			if v.Annotations == nil {
				v.Annotations = make(map[string]string, len(d.Annotations))
			}
			for k, val := range d.Annotations {
				v.Annotations[k] = val
			}
		}
	}
	return v, nil
}

// applyResult validates a result decision and returns the output it leaves.
func applyResult(d *policyv1.ResultDecision, r *executionv1.Result) (stdout, stderr string, err error) {
	switch d.Verdict {
	case policyv1.Verdict_VERDICT_ALLOW, policyv1.Verdict_VERDICT_DENY:
	default:
		return "", "", fmt.Errorf("%w: verdict %v", errInvalid, d.Verdict)
	}
	if len(d.Reason) > maxReasonBytes {
		return "", "", fmt.Errorf("%w: reason longer than %d bytes", errInvalid, maxReasonBytes)
	}
	if err := checkAnnotations(d.Annotations); err != nil {
		return "", "", err
	}
	stdout, stderr = r.GetStdout(), r.GetStderr()
	if d.Verdict == policyv1.Verdict_VERDICT_DENY {
		return stdout, stderr, nil
	}
	var outSpans, errSpans []*policyv1.Redaction
	for _, x := range d.Redactions {
		switch x.Stream {
		case policyv1.Stream_STREAM_STDOUT:
			outSpans = append(outSpans, x)
		case policyv1.Stream_STREAM_STDERR:
			errSpans = append(errSpans, x)
		default:
			return "", "", fmt.Errorf("%w: redaction of stream %v", errInvalid, x.Stream)
		}
	}
	if d.Stdout != nil {
		stdout = d.GetStdout()
	} else if stdout, err = redact(stdout, outSpans); err != nil {
		return "", "", err
	}
	if d.Stderr != nil {
		stderr = d.GetStderr()
	} else if stderr, err = redact(stderr, errSpans); err != nil {
		return "", "", err
	}
	return stdout, stderr, nil
}

// redact replaces the spans of s, which must be in order and not overlap.
// Replacing part of a UTF-8 sequence leaves U+FFFD, as the result's text
// promises valid UTF-8.
func redact(s string, spans []*policyv1.Redaction) (string, error) {
	if len(spans) == 0 {
		return s, nil
	}
	var b []byte
	at := uint32(0)
	for _, x := range spans {
		if x.Start < at || x.End < x.Start || x.End > uint32(len(s)) {
			return "", fmt.Errorf("%w: redaction [%d, %d) out of order or outside %d bytes", errInvalid, x.Start, x.End, len(s))
		}
		b = append(b, s[at:x.Start]...)
		b = append(b, x.Replacement...)
		at = x.End
	}
	b = append(b, s[at:]...)
	if !utf8.Valid(b) {
		return string([]rune(string(b))), nil
	}
	return string(b), nil
}

// knownLanguage reports whether a rewrite may set the language name.
func (e *Engine) knownLanguage(name string) bool {
	if !languageName.MatchString(name) {
		return false
	}
	return e.opts.KnownLanguage == nil || e.opts.KnownLanguage(name)
}

// languageName is the form of a language name in the protos' rules.
var languageName = regexp.MustCompile(`^[a-z][a-z0-9+_.-]{0,31}$`)
