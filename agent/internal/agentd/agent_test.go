package agentd

import (
	"testing"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/agent/internal/languages"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// TestProtocols runs code through the real Connect handlers over real
// HTTP/2, with each protocol the port serves.
func TestProtocols(t *testing.T) {
	t.Parallel()
	a := shared(t)
	for _, protocol := range []string{"grpc", "grpcweb", "connect", "connect+json"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			c := a.client(protocol)
			ctx := t.Context()
			res, err := c.Execute(ctx, connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{
				Language: "python", Code: "print(6*7)",
			}}))
			if err != nil {
				t.Fatal(err)
			}
			r := res.Msg.GetResult()
			if r.GetStdout() != "42\n" || r.GetExitCode() != 0 || r.GetAgent() != a.cfg.Name {
				t.Errorf("result = %v, want stdout 42, exit 0, agent %s", r, a.cfg.Name)
			}

			stream, err := c.ExecuteStream(ctx, connect.NewRequest(&agentv1.ExecuteStreamRequest{Execution: &executionv1.Execution{
				Language: "bash", Code: "echo out; echo err >&2; exit 3",
			}}))
			if err != nil {
				t.Fatal(err)
			}
			var stdout, stderr string
			var final *executionv1.Result
			for stream.Receive() {
				switch ev := stream.Msg().GetEvent().GetEvent().(type) {
				case *executionv1.Event_Stdout:
					stdout += ev.Stdout
				case *executionv1.Event_Stderr:
					stderr += ev.Stderr
				case *executionv1.Event_Result:
					final = ev.Result
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if stdout != "out\n" || stderr != "err\n" || final.GetExitCode() != 3 || final.GetStdout() != "" {
				t.Errorf("stream: stdout %q stderr %q result %v", stdout, stderr, final)
			}

			st, err := c.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			s := st.Msg.GetStatus()
			if !s.GetReady() || s.GetRuntime() != "runsc" || s.GetCapacity() != 12 || len(s.GetLanguages()) != len(languages.All()) || s.GetName() != a.cfg.Name {
				t.Errorf("status = %v", s)
			}
			for _, l := range s.GetLanguages() {
				// The runner reports versions when it starts; sh is dash here.
				if l.GetVersion() == "" {
					t.Errorf("language %s has no version (status %v)", l.GetName(), s)
				}
			}

			_, err = c.Execute(ctx, connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{Language: "cobol", Code: "x"}}))
			if connect.CodeOf(err) != connect.CodeInvalidArgument {
				t.Errorf("unknown language: %v, want invalid_argument", err)
			}
		})
	}
}
