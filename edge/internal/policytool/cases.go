package policytool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/codemode-go/codemode/edge/internal/policy"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Cases is a file of cases: inputs of one phase with the outcome each must
// have, for a module with one configuration. It is JSON; inputs and
// expected messages are the protobuf messages in their JSON form.
//
//	{
//	  "phase": "request",
//	  "config": "mallory",
//	  "cases": [
//	    {"name": "another tenant", "input": {"tenant": "alice", "execution": {"language": "python", "code": "1"}},
//	     "want": {"verdict": "allow"}},
//	    {"name": "the blocked tenant", "input": {"tenant": "mallory"},
//	     "want": {"verdict": "deny", "reason": "tenant is suspended by the tenant policy"}}
//	  ]
//	}
type Cases struct {
	// Phase of the inputs: "request" or "result".
	Phase string `json:"phase"`
	// Config is given to the module's codemode_init.
	Config string `json:"config,omitempty"`
	// Labels the module may route to, as in the edge's configuration.
	Labels map[string][]string `json:"labels,omitempty"`
	Cases  []Case              `json:"cases"`
}

// Case is one input and the outcome it must have.
type Case struct {
	Name string `json:"name"`
	// Input is a codemode.policy.v1.RequestInput or ResultInput in JSON.
	// (A request input's annotations are not passed: in a chain they come
	// from the policies before.)
	Input json.RawMessage `json:"input"`
	Want  Want            `json:"want"`
}

// Want is the outcome a case expects, after the host checked and applied
// the decision; fields left out are not compared.
type Want struct {
	// Verdict: "allow", "deny", or "error" (the call failed: a trap, fuel
	// exhausted, a malformed or invalid decision). Required.
	Verdict string `json:"verdict"`
	// Reason of a deny.
	Reason *string `json:"reason,omitempty"`
	// Annotations of the decision, exactly ({} for none).
	Annotations map[string]string `json:"annotations,omitempty"`
	// Execution to run after rewrites and limits (request phase), as
	// codemode.execution.v1.Execution in JSON.
	Execution json.RawMessage `json:"execution,omitempty"`
	// Route labels (request phase), exactly ({} for none).
	Route map[string]string `json:"route,omitempty"`
	// Egress the run gets (request phase), as codemode.execution.v1.Egress
	// in JSON; {} for nothing.
	Egress json.RawMessage `json:"egress,omitempty"`
	// Result returned after redactions (result phase), as
	// codemode.execution.v1.Result in JSON.
	Result json.RawMessage `json:"result,omitempty"`
	// Error is a part of the failure's message, for verdict "error".
	Error string `json:"error,omitempty"`
}

// ReadCases reads and checks a case file.
func ReadCases(path string) (*Cases, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read cases: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var c Cases
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("decode cases %s: %w", path, err)
	}
	if c.Phase != policy.PhaseRequest && c.Phase != policy.PhaseResult {
		return nil, fmt.Errorf("cases %s: phase must be %q or %q", path, policy.PhaseRequest, policy.PhaseResult)
	}
	for i, k := range c.Cases {
		switch k.Want.Verdict {
		case "allow", "deny", "error":
		default:
			return nil, fmt.Errorf("cases %s: case %d (%s): want.verdict must be allow, deny or error", path, i, k.Name)
		}
	}
	return &c, nil
}

// Outcome is what one input came to through the engine.
type Outcome struct {
	// Verdict: "allow", "deny" or "error".
	Verdict string
	Reason  string
	// Decision the module answered, as the host decoded it (nil: none).
	Decision proto.Message
	// Annotations of the decision.
	Annotations map[string]string
	// Request phase: what the host made of the decision.
	Execution *executionv1.Execution
	Route     map[string]string
	Egress    *executionv1.Egress
	// Result phase: the result after redactions.
	Result *executionv1.Result
	// Err is the call's failure, for verdict "error".
	Err error
	// Fuel used of FuelBudget (both 0 when the module has no fuel), and the
	// call's time.
	Fuel, FuelBudget uint64
	Duration         time.Duration
}

// Evaluate runs one input (JSON of the phase's input message) through the
// loaded module.
func (l *loaded) Evaluate(ctx context.Context, input []byte) (Outcome, error) {
	var o Outcome
	var err error
	switch l.phase {
	case policy.PhaseRequest:
		var in policyv1.RequestInput
		if err := protojson.Unmarshal(input, &in); err != nil {
			return o, fmt.Errorf("decode RequestInput: %w", err)
		}
		if in.Execution == nil {
			in.Execution = &executionv1.Execution{}
		}
		var v policy.RequestVerdict
		v, err = l.engine.EvaluateRequest(ctx, policy.RequestInput{
			Execution: in.Execution, Tenant: in.Tenant, Door: in.Door, RequestID: in.RequestId, Subject: in.Subject,
			Egress: in.Egress, APICall: in.ApiCall,
		})
		o.Execution, o.Route, o.Egress, o.Annotations = v.Execution, v.Route, v.Egress, v.Annotations
	default:
		var in policyv1.ResultInput
		if err := protojson.Unmarshal(input, &in); err != nil {
			return o, fmt.Errorf("decode ResultInput: %w", err)
		}
		if in.Result == nil {
			in.Result = &executionv1.Result{}
		}
		var v policy.ResultVerdict
		v, err = l.engine.EvaluateResult(ctx, policy.ResultInput{
			Result: in.Result, Tenant: in.Tenant, Door: in.Door, RequestID: in.RequestId,
			Language: in.Language, Annotations: in.Annotations,
		})
		o.Result, o.Annotations = v.Result, v.Annotations
	}
	r, called := l.lastReport()
	o.Decision, o.Fuel, o.FuelBudget, o.Duration = r.Decision, r.Fuel, r.FuelBudget, r.Duration
	var denial *policy.Denial
	switch {
	case err == nil:
		o.Verdict = "allow"
	case errors.As(err, &denial) && denial.Cause == policyv1.Cause_CAUSE_DENIED:
		o.Verdict, o.Reason = "deny", denial.Reason
		if d, ok := r.Decision.(interface{ GetAnnotations() map[string]string }); ok {
			o.Annotations = d.GetAnnotations()
		}
	case errors.As(err, &denial) && called:
		o.Verdict, o.Err = "error", r.Err
	default:
		return o, err
	}
	return o, nil
}

// Mismatches compares an outcome with what a case wants; none: it passes.
func (w *Want) Mismatches(o Outcome) ([]string, error) {
	var bad []string
	if o.Verdict != w.Verdict {
		msg := fmt.Sprintf("verdict %s, want %s", o.Verdict, w.Verdict)
		if o.Reason != "" {
			msg += fmt.Sprintf(" (reason %q)", o.Reason)
		}
		if o.Err != nil {
			msg += fmt.Sprintf(" (%v)", o.Err)
		}
		return []string{msg}, nil
	}
	if w.Reason != nil && o.Reason != *w.Reason {
		bad = append(bad, fmt.Sprintf("reason %q, want %q", o.Reason, *w.Reason))
	}
	if w.Error != "" && (o.Err == nil || !strings.Contains(o.Err.Error(), w.Error)) {
		bad = append(bad, fmt.Sprintf("error %v, want one containing %q", o.Err, w.Error))
	}
	if w.Annotations != nil && !maps.Equal(o.Annotations, w.Annotations) {
		bad = append(bad, fmt.Sprintf("annotations %v, want %v", o.Annotations, w.Annotations))
	}
	if w.Route != nil && !maps.Equal(o.Route, w.Route) {
		bad = append(bad, fmt.Sprintf("route %v, want %v", o.Route, w.Route))
	}
	for _, c := range []struct {
		name string
		raw  json.RawMessage
		got  proto.Message
		want proto.Message
	}{
		{"execution", w.Execution, orEmpty(o.Execution), &executionv1.Execution{}},
		{"egress", w.Egress, orEmpty(o.Egress), &executionv1.Egress{}},
		{"result", w.Result, orEmpty(o.Result), &executionv1.Result{}},
	} {
		if len(c.raw) == 0 {
			continue
		}
		if err := protojson.Unmarshal(c.raw, c.want); err != nil {
			return nil, fmt.Errorf("decode want.%s: %w", c.name, err)
		}
		if !proto.Equal(c.got, c.want) {
			bad = append(bad, fmt.Sprintf("%s %s, want %s", c.name, compact(c.got), compact(c.want)))
		}
	}
	slices.Sort(bad)
	return bad, nil
}

// orEmpty returns m, or an empty message of its type when m is nil: a nil
// egress and an empty one both reach nothing.
func orEmpty[M interface {
	proto.Message
	comparable
}](m M) proto.Message {
	var zero M
	if m == zero {
		return m.ProtoReflect().Type().New().Interface()
	}
	return m
}

// compact is a message's JSON on one line.
func compact(m proto.Message) string {
	if m == nil {
		return "none"
	}
	b, err := protojson.MarshalOptions{}.Marshal(m)
	if err != nil {
		return fmt.Sprint(m)
	}
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return string(b)
	}
	if buf.Len() == 0 || buf.String() == "{}" {
		return "{}"
	}
	return buf.String()
}
