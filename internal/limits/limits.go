// Package limits is the one place where the system's limits and defaults
// are written: what a run gets when its request leaves a limit unset, the
// most an operator's configuration may allow, the sizes a request may carry,
// the sandbox image and the rule for a language's name. Every service reads
// them from here; flags default to them; the protos' validation rules and
// comments state the same numbers, and a test (limits_test.go) fails when
// they disagree or when a value is written as a literal elsewhere.
//
// There are two kinds of limit:
//
//   - Defaults. An agent's flags default to them (--default-timeout,
//     --max-timeout, --default-output, --max-output, --memory, --max-memory,
//     --session-idle-ttl, --max-session-idle-ttl, --queue-timeout), and the
//     agents report what they are configured with
//     (codemode.execution.v1.Defaults): the edge fills in the default
//     timeout and refuses a longer one than the maximum, the agent applies
//     the rest (docs/design.md, "Request path"). An operator may change them.
//   - Ceilings. The protos' buf.validate rules: no request carries more, and
//     no configuration may allow more. The runner cuts a timeout to the same
//     ceiling.
//
// # Notes
//
//   - The longest run is the agents' --max-timeout: MaxTimeout (300 s) unless
//     configured otherwise. An operator may raise it up to TimeoutCeiling
//     (24 h), the protos' bound, and no further: the agent refuses a longer
//     one at start-up, and the runner cuts a Run's timeout to the same
//     ceiling rather than to a shorter one of its own, which would cut runs
//     an agent was configured to allow.
//   - A run keeps DefaultOutputBytes (1 MiB) of output unless it asks for
//     more, up to MaxOutputBytes (16 MiB). The runner, for a Run that names
//     no limit (the agent always names one), keeps the same 1 MiB.
package limits

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// Defaults of a run, a sandbox and a session; an agent's flags default to
// them and may change them, within the ceilings below.
const (
	// DefaultTimeout is the wall-clock limit of a run that sets none
	// (--default-timeout).
	DefaultTimeout = 30 * time.Second
	// MaxTimeout is the longest timeout a run may ask for (--max-timeout).
	MaxTimeout = 300 * time.Second

	// DefaultOutputBytes is the stdout plus stderr kept of a run that sets
	// no limit (--default-output).
	DefaultOutputBytes = 1 << 20
	// MaxOutputBytes is the most output a run may ask to keep
	// (--max-output).
	MaxOutputBytes = 16 << 20

	// DefaultMemoryBytes is a sandbox's memory limit (--memory).
	DefaultMemoryBytes = 512 << 20
	// MaxMemoryBytes is the largest memory limit a run may ask for
	// (--max-memory).
	MaxMemoryBytes = 2 << 30
	// MinMemoryBytes is the least memory a sandbox is given: below it,
	// runsc and the runner do not start.
	MinMemoryBytes = 64 << 20

	// DefaultSessionIdle closes a session after this long without a run
	// (--session-idle-ttl).
	DefaultSessionIdle = 10 * time.Minute
	// MaxSessionIdle is the longest idle timeout a session may ask for
	// (--max-session-idle-ttl); it is also the protos' ceiling.
	MaxSessionIdle = 24 * time.Hour

	// QueueTimeout bounds how long a request waits at an agent for a
	// sandbox and a turn at the CPUs (--queue-timeout).
	QueueTimeout = 30 * time.Second
)

// Ceilings: the protos' validation rules. No request carries more and no
// configuration allows more.
const (
	// TimeoutCeiling bounds a run's timeout and --max-timeout.
	TimeoutCeiling = 24 * time.Hour
	// OutputCeiling bounds a run's output limit and --max-output.
	OutputCeiling = 64 << 20
	// MemoryCeiling bounds a run's memory limit and --max-memory.
	MemoryCeiling = 4 << 30

	// MaxCodeBytes is the most source code a run carries (256 KiB).
	MaxCodeBytes = 256 << 10
	// MaxStdinBytes is the most standard input a run carries (1 MiB).
	MaxStdinBytes = 1 << 20
	// MaxFileBytes is the largest file a run carries, WriteFile takes and
	// ReadFile returns (4 MiB).
	MaxFileBytes = 4 << 20
	// MaxFiles is the most files a run carries.
	MaxFiles = 64
)

// SandboxImage is the image the agents run sandboxes from (--image,
// DOCKER_IMAGE_NAME); make image builds it.
const SandboxImage = "codemode-sandbox:bookworm"

// LanguagePattern is the rule for a language's name (or alias) in a
// request: lower case, a letter first, at most 32 characters. Which names
// exist is the agents' languages table's to say.
const LanguagePattern = `^[a-z][a-z0-9+_.-]{0,31}$`

// UnknownLanguage is the error for a language that is not in the table,
// naming the table's languages (valid, in the table's order).
func UnknownLanguage(name string, valid []string) error {
	// Not fmt: the policy SDK imports this package, and a Wasm policy
	// should not carry fmt for it.
	return errors.New("unknown language " + strconv.Quote(name) + ": valid languages are " + strings.Join(valid, ", "))
}
