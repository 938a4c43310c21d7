package controlplaned

import (
	"testing"

	"connectrpc.com/connect"

	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
)

// TestLanguageIsNotDecidedAgain checks that the control plane forwards a
// run and a session whatever their language says: the edge owns the
// language (it canonicalises it against the agents' table) and the agent
// checks it, so the control plane, which only routes, does not decide it a
// second time (docs/design.md, "Request path").
func TestLanguageIsNotDecidedAgain(t *testing.T) {
	t.Parallel()
	a := &stubAgent{name: "a"}
	a.free.Store(2)
	addr, _ := serveAgent(t, a)
	c := controlplanev1connect.NewControlPlaneServiceClient(server.NewClient(), startControlPlane(t, addr))
	waitHealthy(t, c, 1)
	res, err := c.Execute(t.Context(), connect.NewRequest(&cpv1.ExecuteRequest{
		Execution: &executionv1.Execution{Language: "cobol", Code: "DISPLAY 42"},
	}))
	if err != nil || res.Msg.GetResult().GetAgent() != "a" || a.ran.Load() != 1 {
		t.Fatalf("execute: %v %v (agent ran %d), want the run forwarded to the agent", res, err, a.ran.Load())
	}
	_, err = c.CreateSession(t.Context(), connect.NewRequest(&cpv1.CreateSessionRequest{Language: "cobol"}))
	if connect.CodeOf(err) == connect.CodeInvalidArgument {
		t.Fatalf("create session: %v, want it forwarded to the agent", err)
	}
}
