package wire

import (
	"errors"

	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

var (
	// ErrRunnerGone means the stream to the runner broke or the runner stopped
	// answering: the runner or its sandbox died, the attach stream was closed,
	// or a cancelled run did not end within [CancelGrace]. The client is unusable
	// afterwards and the sandbox should be destroyed.
	ErrRunnerGone = errors.New("runner gone")

	// ErrClosed is returned by calls on a client after [Client.Close].
	ErrClosed = errors.New("runner client closed")

	// The runner refused a request. A [*RunnerError] matches the one of these
	// that corresponds to its code, so callers can write
	// errors.Is(err, wire.ErrNotFound).
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrNotFound           = errors.New("not found")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrBusy               = errors.New("runner busy")
	ErrFailedPrecondition = errors.New("failed precondition")
)

// RunnerError is a request that the runner answered with an Error event. It
// describes a problem with the request or with the sandbox's state, not with
// the stream: the client stays usable.
type RunnerError struct {
	Code    runnerv1.Error_Code
	Message string
}

// Error returns the runner's message, which is safe to show to the caller
// (it names paths relative to the workspace, never host paths).
func (e *RunnerError) Error() string { return e.Message }

// Is reports whether target is the sentinel error of e's code.
func (e *RunnerError) Is(target error) bool {
	switch e.Code {
	case runnerv1.Error_CODE_INVALID_ARGUMENT:
		return target == ErrInvalidArgument
	case runnerv1.Error_CODE_NOT_FOUND:
		return target == ErrNotFound
	case runnerv1.Error_CODE_RESOURCE_EXHAUSTED:
		return target == ErrResourceExhausted
	case runnerv1.Error_CODE_BUSY:
		return target == ErrBusy
	case runnerv1.Error_CODE_FAILED_PRECONDITION:
		return target == ErrFailedPrecondition
	}
	return false
}

func remoteError(e *runnerv1.Error) error {
	return &RunnerError{Code: e.GetCode(), Message: e.GetMessage()}
}
