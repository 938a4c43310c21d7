package stdio

import (
	"bytes"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// slowAgent stands in for an agent that reads the attach stream slowly.
type slowAgent struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	delay  time.Duration
	stdout int
}

func (a *slowAgent) Write(p []byte) (int, error) {
	time.Sleep(a.delay)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.buf.Write(p)
	return len(p), nil
}

func (a *slowAgent) stdoutBytes(t *testing.T) int {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	r := bytes.NewReader(a.buf.Bytes())
	for {
		var ev runnerv1.Event
		if err := wire.ReadFrame(r, &ev); err == io.EOF {
			return n
		} else if err != nil {
			t.Fatal(err)
		}
		n += len(ev.GetStdout())
	}
}

// A run's output written before it ended reaches the agent in full, even
// when the agent reads slowly and a background process keeps the pipe open;
// what is written after the end is dropped, and finish does not wait for it.
func TestFinishDeliversWhatWasWrittenBeforeTheEnd(t *testing.T) {
	t.Parallel()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() // the "background process" holding the pipe

	agent := &slowAgent{delay: 2 * time.Millisecond}
	o := NewOutput(1, NewWriter(agent), 64<<20)
	o.Pump(1, r)

	const before = 256 << 10 // more than a pipe holds, so the pump is mid-send at the end
	written := make(chan struct{})
	go func() {
		defer close(written)
		if _, err := w.Write(bytes.Repeat([]byte("x"), before)); err != nil {
			t.Error(err)
		}
	}()
	<-written // the program has written everything and "exited"

	start := time.Now()
	truncated := o.Finish(10 * time.Millisecond)
	elapsed := time.Since(start)
	if truncated {
		t.Fatal("finish reports truncated output")
	}
	if got := agent.stdoutBytes(t); got != before {
		t.Fatalf("agent received %d bytes of stdout, want %d", got, before)
	}
	if elapsed > 10*time.Second {
		t.Fatalf("finish took %s", elapsed)
	}
	// Written after the end: dropped (the pump has closed its end, so the
	// writer may see a broken pipe).
	_, _ = w.Write([]byte("late"))
	time.Sleep(50 * time.Millisecond) // room for the late write to arrive, if it would
	if got := agent.stdoutBytes(t); got != before {
		t.Fatalf("agent received %d bytes after the end, want still %d", got, before)
	}
}
