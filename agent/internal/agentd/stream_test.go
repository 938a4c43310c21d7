package agentd

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// TestStreamingIsLive shows each line of a program that prints once a
// second arriving about a second after the one before, over each protocol.
func TestStreamingIsLive(t *testing.T) {
	t.Parallel()
	a := shared(t)
	for _, protocol := range []string{"grpc", "grpcweb", "connect"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			stream, err := a.client(protocol).ExecuteStream(t.Context(), connect.NewRequest(&agentv1.ExecuteStreamRequest{Execution: &executionv1.Execution{
				Language: "python", Code: "import time\nfor i in range(3):\n    print(i)\n    time.sleep(1)",
			}}))
			if err != nil {
				t.Fatal(err)
			}
			var (
				out    string
				times  []time.Time
				result *executionv1.Result
			)
			for stream.Receive() {
				switch ev := stream.Msg().GetEvent().GetEvent().(type) {
				case *executionv1.Event_Stdout:
					// A line may come in more than one chunk: note when
					// each line ends.
					out += ev.Stdout
					for range strings.Count(ev.Stdout, "\n") {
						times = append(times, time.Now())
					}
				case *executionv1.Event_Result:
					result = ev.Result
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			if out != "0\n1\n2\n" || len(times) != 3 || result.GetExitCode() != 0 {
				t.Fatalf("stdout %q, result %v", out, result)
			}
			for i := 1; i < len(times); i++ {
				if gap := times[i].Sub(times[i-1]); gap < 700*time.Millisecond || gap > 1500*time.Millisecond {
					t.Errorf("line %d came %v after the one before, want about 1 s", i, gap)
				}
			}
		})
	}
}
