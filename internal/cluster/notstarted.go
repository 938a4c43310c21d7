package cluster

import (
	"errors"
	"net"

	"connectrpc.com/connect"
)

// NotStartedHeader is set on an agent's error when the agent turned the call
// away before running anything: every sandbox in use, its engine away, the
// agent shutting down. A caller may offer such a call to another agent.
const NotStartedHeader = "Codemode-Not-Started"

// MarkNotStarted marks err as a call the service turned away before it
// started anything, and returns it.
func MarkNotStarted(err *connect.Error) *connect.Error {
	err.Meta().Set(NotStartedHeader, "1")
	return err
}

// NotStarted reports whether err, from a call to another service, says that
// the call certainly started nothing there: no connection reached the
// service, or the service answered with MarkNotStarted. Any other failure,
// a connection that broke mid-call above all, may come after a run started,
// so a call that failed so must not be made again elsewhere: none runs twice.
func NotStarted(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var ce *connect.Error
	return errors.As(err, &ce) && connect.IsWireError(ce) && ce.Meta().Get(NotStartedHeader) == "1"
}
