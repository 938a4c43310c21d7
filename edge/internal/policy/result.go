package policy

import (
	"context"
	"fmt"
	"unicode/utf8"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"google.golang.org/protobuf/proto"
)

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
	if len(g.result) == 0 {
		return ResultVerdict{Result: in.Result, Generation: g.id}, nil
	}
	p := &resultPhase{
		v:   ResultVerdict{Result: in.Result, Generation: g.id},
		msg: &policyv1.ResultInput{Tenant: in.Tenant, Door: in.Door, RequestId: in.RequestID, Language: in.Language, Annotations: in.Annotations},
	}
	c := chain{
		phase:     "result",
		requestID: in.RequestID, tenant: in.Tenant,
		denied: "result withheld by policy ", logDenied: "result withheld by policy",
		onCall: e.opts.OnCall,
	}
	annotations, err := runChain[policyv1.ResultDecision](ctx, g.result, c, p)
	if err != nil {
		return ResultVerdict{}, err
	}
	p.v.Annotations = annotations
	return p.v, nil
}

// resultPhase is one result's state in the result chain.
type resultPhase struct {
	v      ResultVerdict // so far
	msg    *policyv1.ResultInput
	cloned bool // v.Result is the evaluation's own copy
	// stdout and stderr are the output that the decision last checked
	// leaves.
	stdout, stderr string
}

// encode writes the result as the policies before left it; the
// annotations are the request phase's, set once.
func (p *resultPhase) encode(b []byte, _ map[string]string) ([]byte, error) {
	p.msg.Result = p.v.Result
	return (proto.MarshalOptions{}).MarshalAppend(b, p.msg)
}

func (p *resultPhase) check(d *policyv1.ResultDecision) (err error) {
	p.stdout, p.stderr, err = applyResult(d, p.v.Result)
	return err
}

func (p *resultPhase) apply(_ *module, _ *policyv1.ResultDecision) (changed bool) {
	v := &p.v
	if p.stdout == v.Result.GetStdout() && p.stderr == v.Result.GetStderr() {
		return false
	}
	if !p.cloned {
		v.Result, p.cloned = proto.CloneOf(v.Result), true
	}
	v.Result.Stdout, v.Result.Stderr = p.stdout, p.stderr
	return true
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
