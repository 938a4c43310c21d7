package runner

import (
	"os"
	"sync"
	"time"

	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

const chunkSize = 32 << 10

// output passes a run's stdout and stderr to the agent as events, chunk by
// chunk as they are read, up to a limit on both together. Past the limit it
// keeps reading and drops the bytes, so the program is never blocked on a
// full pipe and ends (or times out) as it would have; the Exit says
// truncated. Once the run has ended, anything still arriving (from a
// background process holding a pipe) is dropped too.
type output struct {
	id  uint64
	out *eventWriter

	mu        sync.Mutex
	left      uint64
	truncated bool
	closed    bool

	wg sync.WaitGroup
}

func newOutput(id uint64, out *eventWriter, limit uint64) *output {
	return &output{id: id, out: out, left: limit}
}

// pump reads r until EOF in its own goroutine and closes it.
func (o *output) pump(stream int, r *os.File) {
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		defer r.Close()
		buf := make([]byte, chunkSize)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				o.write(stream, buf[:n])
			}
			if err != nil { // EOF: every writer is gone
				return
			}
		}
	}()
}

// write sends p (or the part of it within the limit) as one event.
func (o *output) write(stream int, p []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return
	}
	if uint64(len(p)) > o.left {
		p = p[:o.left]
		o.truncated = true
	}
	if len(p) == 0 {
		return
	}
	o.left -= uint64(len(p))
	o.send(stream, p)
}

// note sends a message of the runner to the program's stderr stream,
// outside the limit.
func (o *output) note(msg string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.send(2, []byte(msg))
}

func (o *output) send(stream int, p []byte) {
	ev := &runnerv1.Event{Id: o.id}
	if stream == 1 {
		ev.Kind = &runnerv1.Event_Stdout{Stdout: p}
	} else {
		ev.Kind = &runnerv1.Event_Stderr{Stderr: p}
	}
	// WriteFrame marshals p before it returns, so the caller may reuse it.
	// A failed write means the agent is gone; the runner notices on stdin.
	_ = o.out.send(ev)
}

// finish waits until every pump has reached EOF or grace has passed, then
// drops any later output. It reports whether output was truncated.
func (o *output) finish(grace time.Duration) bool {
	done := make(chan struct{})
	go func() {
		o.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	return o.truncated
}

// feed writes b to w in its own goroutine and closes w. A program that
// exits without reading all of its stdin makes the write fail; that is
// fine.
func feed(w *os.File, b []byte) {
	go func() {
		defer w.Close()
		_, _ = w.Write(b)
	}()
}
