package agentd

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/testkit"
)

// TestStreamingIsLive shows the lines of a program that prints once a
// second for three seconds arriving as they are printed, over each protocol:
// buffered, they would come together at the end.
func TestStreamingIsLive(t *testing.T) {
	t.Parallel()
	a := shared(t)
	for _, protocol := range []string{"grpc", "grpcweb", "connect"} {
		t.Run(protocol, func(t *testing.T) {
			t.Parallel()
			stream, err := a.client(protocol).ExecuteStream(t.Context(), connect.NewRequest(&agentv1.ExecuteStreamRequest{Execution: &executionv1.Execution{
				Language: "python", Code: "import time\nfor i in range(4):\n    print(i)\n    time.sleep(1)",
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
			if out != "0\n1\n2\n3\n" || len(times) != 4 || result.GetExitCode() != 0 {
				t.Fatalf("stdout %q, result %v", out, result)
			}
			// The lines are printed 1 s apart, 3 s from first to last.
			// Buffering brings them all at once. On a loaded machine
			// any line may come late, so the bounds are loose: the first
			// must come half the program's time before the last, and no
			// gap may be far longer than the program's own.
			if span := times[len(times)-1].Sub(times[0]); span < 1500*time.Millisecond {
				t.Errorf("the lines came within %v of each other, want about 3 s", span)
			}
			for i := 1; i < len(times); i++ {
				if gap := times[i].Sub(times[i-1]); gap > 3*time.Second {
					t.Errorf("line %d came %v after the one before, want about 1 s", i, gap)
				}
			}
		})
	}
}

// TestStreamingSplitsNoCharacter streams multi-byte characters written in
// chunks that cut them in the middle; the text received is whole.
func TestStreamingSplitsNoCharacter(t *testing.T) {
	t.Parallel()
	a := shared(t)
	const n = 100000 // "€" is 3 bytes; writes of 4097 bytes cut it
	stream, err := a.client("connect").ExecuteStream(t.Context(), connect.NewRequest(&agentv1.ExecuteStreamRequest{Execution: &executionv1.Execution{
		Language: "python", Code: fmt.Sprintf("import sys\nb = '€'.encode() * %d\nfor i in range(0, len(b), 4097):\n    sys.stdout.buffer.write(b[i:i+4097]); sys.stdout.buffer.flush()", n),
	}}))
	if err != nil {
		t.Fatal(err)
	}
	var (
		out    strings.Builder
		events int
		result *executionv1.Result
	)
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().GetEvent().(type) {
		case *executionv1.Event_Stdout:
			if !utf8.ValidString(ev.Stdout) {
				t.Fatalf("event %d is not valid UTF-8", events)
			}
			out.WriteString(ev.Stdout)
			events++
		case *executionv1.Event_Result:
			result = ev.Result
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if want := strings.Repeat("€", n); out.String() != want {
		t.Errorf("received %d bytes in %d events (a prefix of what was written: %v), want %d euro signs; result %v",
			out.Len(), events, strings.HasPrefix(want, out.String()), n, result)
	}
}

// TestStreamCancelled cancels a stream mid-run: the run ends, its sandbox
// comes free, and the agent keeps serving.
func TestStreamCancelled(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) { c.MinActive = 1; c.MaxSandboxes = 1; c.MaxSessions = 0 })
	a.waitWarm(t, 1)
	ctx, cancel := context.WithCancel(t.Context())
	stream, err := a.client("grpc").ExecuteStream(ctx, connect.NewRequest(&agentv1.ExecuteStreamRequest{Execution: &executionv1.Execution{
		Language: "bash", Code: "echo started; sleep 60",
	}}))
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() {
		t.Fatalf("no first event: %v", stream.Err())
	}
	cancel()
	for stream.Receive() {
	}
	stream.Close()
	t0 := time.Now()
	// The only sandbox must come free for this run.
	if r := a.exec(t, &executionv1.Execution{Language: "python", Code: "print(5)"}); r.GetStdout() != "5\n" {
		t.Errorf("next run: %v", r)
	}
	if d := time.Since(t0); d > 15*time.Second {
		t.Errorf("next run waited %v", d)
	}
}

// TestStreamCancelledInSession cancels streams in a session while their
// program is writing, or sleeping next to a child it started: the agent
// must not send on a stream once its handler has returned (that panics
// the whole agent), and the session runs again afterwards.
func TestStreamCancelledInSession(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) { c.MinActive = 1; c.MaxSandboxes = 2; c.MaxSessions = 1 })
	codes := []string{
		"import time\nwhile True:\n    print('x' * 200)\n    time.sleep(0.001)",
		"import subprocess, time\nsubprocess.Popen(['sleep', '271'])\nprint('started')\ntime.sleep(100)",
	}
	for i := range 6 {
		ctx, cancel := context.WithCancel(t.Context())
		stream, err := a.client("connect").ExecuteStream(ctx, connect.NewRequest(&agentv1.ExecuteStreamRequest{AllowNewSession: true, Execution: &executionv1.Execution{
			Language: "python", SessionId: "cancelled-session", Code: codes[i%2],
		}}))
		if err != nil {
			t.Fatal(err)
		}
		if !stream.Receive() {
			t.Fatalf("no first event: %v", stream.Err())
		}
		time.Sleep(time.Duration(i) * 100 * time.Millisecond) // cancel at a different point of the run each time
		cancel()
		for stream.Receive() {
		}
		stream.Close()
	}
	var r *executionv1.Result
	_ = testkit.Poll(10*time.Second, func() error { // the session may still be ending the cancelled run
		res, err := a.client("connect").Execute(t.Context(), connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{
			Language: "python", SessionId: "cancelled-session", Code: "print(5)",
		}}))
		if err == nil {
			r = res.Msg.GetResult()
		}
		return err
	})
	if r.GetStdout() != "5\n" {
		t.Errorf("the session does not run after the cancels: %v", r)
	}
}
