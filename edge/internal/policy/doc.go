// Package policy hosts the edge's WebAssembly policies on wazero: it loads
// the modules a configuration file lists, keeps a bounded pool of warm
// instances per module, and runs every request (and result) through the
// chain of policies of its phase, validating each decision. Request
// policies may narrow the run's egress, never widen it (see
// internal/egressrule).
//
// The ABI the modules implement is policies/ABI.md (ABI v1): protobuf
// messages of codemode.policy.v1 written into a guest buffer and read back
// from guest memory, one exported call per evaluation.
//
// # Lifecycle
//
// [New] loads the configuration (if any) into generation 1. [Engine.Reload]
// and [Engine.Watch] build a new generation off the request path (read,
// check digests, compile, instantiate and initialise every pool), swap it in
// atomically, and close the old one once the evaluations that started on it
// have finished. A configuration that fails to load leaves the serving
// generation alone; the error is logged and reported by the admin service.
// [Engine.Close] closes everything.
//
// # Safety
//
// Every call has a budget of work, its fuel (default 10M units plus 64 per
// input byte; a unit is a loop iteration or a function call): modules are
// rewritten at load with a check at every function entry and loop head
// that counts fuel down and traps when it runs out, so a call waiting for a
// CPU is never cut short (package wasminterrupt). A wall-clock deadline
// (default 10 s) is the backstop, for a call blocked in a host function: a
// timer sets a flag the same check tests. Modules that cannot be rewritten
// have no fuel and are stopped at the deadline by wazero's
// WithCloseOnContextDone. Cancelling the caller's context interrupts a call
// as the deadline does. Each module's memory is capped
// (WithMemoryLimitPages), and an instance whose call failed in any way
// (trap, out of fuel, timeout, malformed decision) is discarded and
// replaced in the background. A failing policy denies the request with
// reason "policy_unavailable" unless it is configured to fail open.
//
// # Concurrency
//
// An Engine is safe for concurrent use. Each evaluation holds one generation
// from its first policy to its last, so a chain is never evaluated by two
// generations.
package policy
