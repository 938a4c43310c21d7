// Package sdk lets a policy for the codemode edge be written in Go as one
// function over plain Go types, and built with the standard toolchain:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o policy.wasm .
//
// A policy registers its handlers from an init function; its main function is
// never called and can be empty:
//
//	func init() {
//		sdk.HandleRequest(func(in *sdk.RequestInput) sdk.RequestDecision {
//			if in.Tenant == "anonymous" {
//				return sdk.Deny("sign in first")
//			}
//			return sdk.Allow()
//		})
//	}
//
//	func main() {}
//
// The SDK implements ABI v1 (policies/ABI.md): it exports the memory, the
// input buffer, the version marker and the evaluate calls, and converts the
// protobuf bytes of codemode.policy.v1 to and from the types here with a small
// codec over the wire format (no protobuf runtime in the guest; see
// policies/RATIONALE.md for the measurements behind that choice).
//
// The types mirror the messages of proto/codemode/policy/v1/policy.proto
// field for field; Execution flattens execution.v1.Limits into MemoryBytes and
// OutputBytes, and the input's Egress is a value (unset and empty both allow
// nothing) where the decision's is a pointer (nil leaves egress unchanged). The codec builds on every platform, so it is tested on the host
// against the generated types.
//
// Handlers run one call at a time per instance; the host keeps several
// instances, each with its own globals. State kept in globals lives as long as
// the instance, which the host may discard and replace at any time.
package sdk

import (
	"time"

	"github.com/codemode-go/codemode/internal/limits"
)

// DefaultTimeout is the timeout of a run whose request sets none, unless
// the agents are configured with another. The edge fills in the agents'
// default before policies run, so a policy sees a zero timeout only while
// no agent has reported one.
const DefaultTimeout = limits.DefaultTimeout

// Verdict is a policy's answer; see codemode.policy.v1.Verdict.
type Verdict int32

// Verdicts.
const (
	VerdictUnspecified Verdict = 0
	VerdictAllow       Verdict = 1
	VerdictDeny        Verdict = 2
)

// Stream names an output stream; see codemode.policy.v1.Stream.
type Stream int32

// Streams.
const (
	StreamUnspecified Stream = 0
	StreamStdout      Stream = 1
	StreamStderr      Stream = 2
)

// File is a file written into the sandbox's /workspace before the run.
type File struct {
	Path    string
	Content []byte
}

// Execution is what the caller asked to run (codemode.execution.v1.Execution).
type Execution struct {
	// Language: a name from the agents' language table (ListLanguages), for
	// example "python"; aliases arrive as the table's name.
	Language string
	// Source code.
	Code string
	// Session to run in, or empty.
	SessionID string
	// Wall-clock limit; 0 for the edge's default.
	Timeout time.Duration
	// Standard input.
	Stdin []byte
	// Files written before the run.
	Files []File
	// execution.limits.memory_bytes; 0 for the default.
	MemoryBytes uint64
	// execution.limits.output_bytes; 0 for the default.
	OutputBytes uint64
}

// RequestInput is the input of the request phase.
type RequestInput struct {
	Execution Execution
	// Tenant the caller authenticated as; "anonymous" when it sent no key.
	Tenant string
	// Door: "connect", "grpc", "grpcweb", "mcp", ...
	Door string
	// Identifier of the request.
	RequestID string
	// Annotations set by earlier policies of the chain.
	Annotations map[string]string
	// Egress is what the run may reach outside its sandbox: the tenant's
	// configuration as earlier policies of the chain narrowed it. No rules:
	// nothing.
	Egress Egress
	// Subject is who the caller is within its tenant when it came with a
	// token of an OpenID provider: a hash of the issuer and the token's
	// subject; empty for API keys.
	Subject string
	// APICall is set when the request is a call of a declared API tool
	// (door "mcp-api"), which the edge makes itself; Execution then means
	// nothing.
	APICall *APICall
}

// Egress says what a run may reach outside its sandbox
// (codemode.execution.v1.Egress).
type Egress struct {
	// Allow lists the destinations a connection may go to.
	Allow  []EgressRule
	Limits EgressLimits
}

// EgressRule allows connections to a host on some ports.
type EgressRule struct {
	// Host is a name ("api.example.com"), every name below a domain
	// ("*.example.com", not the domain itself), an IP address ("192.0.2.7")
	// or an address prefix ("192.0.2.0/24"). Names ending in ".api.codemode"
	// are the edge's configured APIs, which the agent forwards with their
	// credentials.
	Host string
	// Ports; none: 80 and 443.
	Ports []uint32
}

// EgressLimits bound a run's egress; zero is the agent's default.
type EgressLimits struct {
	// Connections a run may open.
	Connections uint32
	// Bytes a run may send and receive, all connections together.
	Bytes uint64
	// ConnectionTime is how long one connection may stay open.
	ConnectionTime time.Duration
}

// APICall is a call of a declared API tool (codemode.policy.v1.ApiCall).
type APICall struct {
	// API is the API's name, as in its declaration ("github").
	API string
	// Tool is the tool's name ("github_list_repos").
	Tool string
	// ArgumentsJSON holds the tool's arguments as the model sent them (a JSON
	// object).
	ArgumentsJSON string
	// Method and URL the call goes to, arguments filled in.
	Method string
	URL    string
}

// Rewrite replaces fields of the execution; nil fields are left alone.
type Rewrite struct {
	Code     *string
	Language *string
	// Stdin replaces the standard input when SetStdin is true.
	Stdin    []byte
	SetStdin bool
}

// Limits are limits a policy applies; zero is no opinion. Each may only
// tighten what the request already allows.
type Limits struct {
	Timeout     time.Duration
	MemoryBytes uint64
	OutputBytes uint64
}

// RequestDecision is the answer of the request phase.
type RequestDecision struct {
	Verdict Verdict
	// Reason shown to the caller when denied.
	Reason  string
	Rewrite Rewrite
	Limits  Limits
	// Route holds agent labels the run must go to.
	Route map[string]string
	// RoutePriority settles conflicting route labels: the highest wins.
	RoutePriority int32
	Annotations   map[string]string
	// Egress, when not nil, sets what the run may reach: the host narrows it
	// to what the input's Egress allows too (rules it does not cover are
	// dropped, limits above the input's are lowered), so it can take egress
	// away but never add any. A non-nil Egress with no rules: nothing. Nil:
	// unchanged. Hosts older than the egress field refuse decisions that set
	// it.
	Egress *Egress
}

// Result is what came of a run (codemode.execution.v1.Result).
type Result struct {
	ExitCode  int32
	Stdout    string
	Stderr    string
	TimedOut  bool
	Truncated bool
	OOMKilled bool
	Duration  time.Duration
	Agent     string
	SessionID string
}

// ResultInput is the input of the result phase.
type ResultInput struct {
	Result      Result
	Tenant      string
	Door        string
	RequestID   string
	Language    string
	Annotations map[string]string
}

// Redaction replaces the bytes [Start, End) of one stream with Replacement.
type Redaction struct {
	Stream      Stream
	Start, End  uint32
	Replacement string
}

// ResultDecision is the answer of the result phase.
type ResultDecision struct {
	Verdict Verdict
	// Reason shown to the caller when the result is withheld.
	Reason     string
	Redactions []Redaction
	// Stdout and Stderr, when not nil, replace the whole stream.
	Stdout      *string
	Stderr      *string
	Annotations map[string]string
}

// Allow returns a decision that lets the request through unchanged.
func Allow() RequestDecision { return RequestDecision{Verdict: VerdictAllow} }

// Deny returns a decision that refuses the request with reason.
func Deny(reason string) RequestDecision {
	return RequestDecision{Verdict: VerdictDeny, Reason: reason}
}

// AllowResult returns a result decision that lets the result through unchanged.
func AllowResult() ResultDecision { return ResultDecision{Verdict: VerdictAllow} }

// String returns a pointer to s, for Rewrite and ResultDecision fields.
func String(s string) *string { return &s }
