package agentd

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// TestRunSlots runs programs at an agent with one run slot: a second run
// waits for the first's slot, and one that cannot get it within the queue
// timeout is refused as resource_exhausted, with nothing run.
func TestRunSlots(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) {
		c.MinActive = 2
		c.RunSlots = 1
		// Long enough for the scrub between two runs on a loaded host;
		// the first run below outlasts it.
		c.QueueTimeout = 5 * time.Second
		c.RunSlotHold = 30 * time.Second
	})
	a.waitWarm(t, 2)
	c := a.client("connect")

	// The first run holds the only slot: it prints, then sleeps past the
	// second's queue timeout (5 s), but within the slot's hold time.
	stream, err := c.ExecuteStream(t.Context(), connect.NewRequest(&agentv1.ExecuteStreamRequest{Execution: &executionv1.Execution{
		Language: "python", Code: "import time\nprint('go', flush=True)\ntime.sleep(10)",
	}}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	for stream.Receive() {
		if strings.Contains(string(stream.Msg().GetEvent().GetStdout()), "go") {
			break
		}
	}
	if a.svc.gate.Stats().Admitted != 1 {
		t.Fatalf("run slots admitted = %d while one run holds its slot, want 1", a.svc.gate.Stats().Admitted)
	}
	_, err = c.Execute(t.Context(), connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{
		Language: "python", Code: "print(1)",
	}}))
	if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "saturated") {
		t.Fatalf("run while the only slot is held = %v, want resource_exhausted (saturated)", err)
	}
	for stream.Receive() {
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}

	// Two runs at once through one slot: the second starts only once the
	// first has given its slot to its sandbox's scrub and that has ended,
	// so they do not overlap.
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		ends []time.Time
		errs []error
	)
	t0 := time.Now()
	for range 2 {
		wg.Go(func() {
			r, err := c.Execute(t.Context(), connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{
				Language: "python", Code: "import time\ntime.sleep(0.5)",
			}}))
			if err == nil && r.Msg.GetResult().GetExitCode() != 0 {
				err = errors.New(r.Msg.GetResult().String())
			}
			mu.Lock()
			defer mu.Unlock()
			ends = append(ends, time.Now())
			errs = append(errs, err)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if last := max(ends[0].Sub(t0), ends[1].Sub(t0)); last < time.Second {
		t.Errorf("two 0.5 s runs through one slot ended within %v: they overlapped", last)
	}
	if st := a.svc.gate.Stats(); st.Waiting != 0 {
		t.Errorf("gate = %+v after every run, want none waiting", st)
	}
}
