// Package stdio is the standard input, output and error of the user's
// processes: pipes, standard input fed to them, and their output passed to
// the agent as events as it is read, within the run's output limit. See the
// runner's RATIONALE.md ("Output: read and drop past the limit").
package stdio

import (
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

const chunkSize = 32 << 10

// Writer writes whole event frames to the runner's stdout, one at a time.
type Writer struct {
	mu sync.Mutex
	w  io.Writer
}

// NewWriter writes frames to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Send writes ev as one frame.
func (w *Writer) Send(ev *runnerv1.Event) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return wire.WriteFrame(w.w, ev)
}

// Output passes a run's stdout and stderr to the agent as events, chunk by
// chunk as they are read, up to a limit on both together. Past the limit it
// keeps reading and drops the bytes, so the program is never blocked on a
// full pipe and ends (or times out) as it would have; the Exit says
// truncated. Once the run has ended, what its processes wrote before that
// is still delivered in full, and anything written later (by a background
// process holding a pipe) is dropped.
type Output struct {
	id  uint64
	out *Writer

	mu        sync.Mutex
	left      uint64
	truncated bool
	closed    bool

	wg     sync.WaitGroup
	pipes  []*pipe
	flushT time.Duration // bound on delivering what was written before the end
}

// pipe is one stream's read end.
type pipe struct {
	r        *os.File
	draining atomic.Bool // the run has ended: read only what the pipe holds
}

// NewOutput passes the output of run id to out, up to limit bytes.
func NewOutput(id uint64, out *Writer, limit uint64) *Output {
	return &Output{id: id, out: out, left: limit, flushT: flushTimeout}
}

// flushTimeout bounds how long output written before a run ended may take
// to reach the agent. Only an agent that stopped reading makes it matter.
const flushTimeout = 30 * time.Second

// Pump reads r until EOF in its own goroutine and closes it. Once Finish
// has started draining, the pump reads only the bytes the pipe holds when it
// notices, then stops.
func (o *Output) Pump(stream int, r *os.File) {
	p := &pipe{r: r}
	o.pipes = append(o.pipes, p)
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		defer r.Close()
		buf := make([]byte, chunkSize)
		owed := int64(-1) // unknown until draining starts
		for {
			want := buf
			if p.draining.Load() {
				if owed < 0 {
					owed = pipeBuffered(r)
				}
				if owed == 0 {
					return
				}
				// The bytes are there, so this read does not block; clear the
				// deadline Finish set to wake a reader blocked on no data.
				_ = r.SetReadDeadline(time.Time{})
				want = buf[:min(int64(len(buf)), owed)]
			}
			n, err := r.Read(want)
			if n > 0 {
				if owed > 0 {
					owed -= int64(n)
				}
				o.write(stream, buf[:n])
			}
			switch {
			case err == nil:
			case errors.Is(err, os.ErrDeadlineExceeded):
				// Woken by Finish; the loop decides whether anything is owed.
			default: // EOF: every writer is gone
				return
			}
		}
	}()
}

// write sends p (or the part of it within the limit) as one event.
func (o *Output) write(stream int, p []byte) {
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

// Note sends a message of the runner to the program's stderr stream,
// outside the limit.
func (o *Output) Note(msg string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.send(2, []byte(msg))
}

func (o *Output) send(stream int, p []byte) {
	ev := &runnerv1.Event{Id: o.id}
	if stream == 1 {
		ev.Kind = &runnerv1.Event_Stdout{Stdout: p}
	} else {
		ev.Kind = &runnerv1.Event_Stderr{Stderr: p}
	}
	// WriteFrame marshals p before it returns, so the caller may reuse it.
	// A failed write means the agent is gone; the runner notices on stdin.
	_ = o.out.Send(ev)
}

// Finish is called once the run has ended. It waits up to grace for every
// pump to reach EOF; pumps still going then (a background process holds a
// pipe, or the agent reads slowly) deliver exactly the bytes that were in
// their pipe at that moment and stop. Anything written later is dropped.
// Finish reports whether output was truncated, which includes output lost
// because it could not be delivered within flushTimeout.
func (o *Output) Finish(grace time.Duration) bool {
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
		for _, p := range o.pipes {
			p.draining.Store(true)
			_ = p.r.SetReadDeadline(time.Now())
		}
		t.Reset(o.flushT)
		select {
		case <-done:
		case <-t.C:
			o.mu.Lock()
			o.truncated = true
			o.mu.Unlock()
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	return o.truncated
}

// pipeBuffered returns how many bytes are waiting to be read from r.
func pipeBuffered(r *os.File) int64 {
	var n int
	rc, err := r.SyscallConn()
	if err != nil {
		return 0
	}
	_ = rc.Control(func(fd uintptr) {
		v, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ) // TIOCINQ is FIONREAD
		if err == nil {
			n = v
		}
	})
	return int64(n)
}

// Feed writes b to w in its own goroutine and closes w. A program that
// exits without reading all of its stdin makes the write fail; that is
// fine.
func Feed(w *os.File, b []byte) {
	go func() {
		defer w.Close()
		_, _ = w.Write(b)
	}()
}
