package wire

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// Stream names the output stream a chunk of a run came from.
type Stream int

const (
	Stdout Stream = 1
	Stderr Stream = 2
)

func (s Stream) String() string {
	switch s {
	case Stdout:
		return "stdout"
	case Stderr:
		return "stderr"
	}
	return fmt.Sprintf("Stream(%d)", int(s))
}

// CancelGrace is how long [Client.Run] waits for the runner to report the end
// of a run after it sent the run's Cancel. The runner kills the run's
// processes at once, so only a runner that is stuck or gone takes longer.
const CancelGrace = 5 * time.Second

// Client talks to one runner over a pair of streams: it writes requests to w
// and reads events from r.
//
// NewClient starts a goroutine that reads r until it fails, or until
// [Client.Close]. A Client serves one request at a time; it is safe for
// concurrent use, and concurrent calls wait their turn (or until their
// context is done).
//
// # Errors
//
// Errors wrapping [ErrRunnerGone] mean the runner cannot be used any more:
// every later call fails with the same error, and the caller should destroy
// the sandbox. A [*RunnerError] is the runner refusing one request; the
// client stays usable. A user program that fails is not an error: it is an
// Exit with a non-zero code.
type Client struct {
	w   io.Writer
	wmu sync.Mutex // serializes writes to w

	// sem holds a token while a call owns the request/answer exchange.
	sem chan struct{}
	// The following are guarded by sem.
	nextID uint64
	// pending is the id of a request whose answer its caller stopped waiting
	// for (its context ended); the next call consumes that answer first.
	pending uint64
	broken  error

	events    chan *runnerv1.Event // closed when the reader stops
	stopped   chan struct{}        // closed when the reader stops
	readErr   error                // why the reader stopped; set before stopped is closed
	quit      chan struct{}        // closed by Close or when the client breaks
	closeOnce sync.Once

	readyCh   chan struct{}
	readyOnce sync.Once
	ready     *runnerv1.Ready

	// prestarted is the interpreter the runner last said it prestarted
	// (Ready, then each Reset).
	prestarted atomic.Pointer[Prestart]

	cancelGrace time.Duration // CancelGrace, shorter in tests

	// The egress connections of the run going on (see RunEgress).
	tunnels *Tunnels
	egress  atomic.Pointer[runEgress]
}

// Egress decides on and serves the connections that a run's programs ask
// the runner's egress proxy for.
type Egress interface {
	// Open decides on a connection to host:port. If it is allowed, Open
	// returns a function that serves it: it gets the program's end of the
	// connection, runs on a goroutine of its own, and must close t when it
	// is done. Otherwise Open returns an error, an [*EgressRefusal] to
	// choose the proxy's answer (other errors are 502 Bad Gateway). ctx
	// ends when the run does.
	Open(ctx context.Context, host string, port uint32) (serve func(t *Tunnel), err error)
}

// EgressRefusal is an egress connection refused: the runner's proxy answers
// the program with Status and Reason.
type EgressRefusal struct {
	Status int // an HTTP status: 403 not allowed, 429 limit reached, 502 unreachable
	Reason string
}

func (e *EgressRefusal) Error() string { return e.Reason }

// runEgress is the egress of the run going on.
type runEgress struct {
	run uint64
	e   Egress
	ctx context.Context
}

// NewClient returns a client that sends requests to w and reads the runner's
// events from r (with Docker, the demultiplexed stdout of the container's
// attach stream). r and w stay owned by the caller: close them to end the
// client's reader goroutine if the runner does not end the stream itself.
func NewClient(r io.Reader, w io.Writer) *Client {
	c := &Client{
		w:       w,
		sem:     make(chan struct{}, 1),
		events:  make(chan *runnerv1.Event, 16),
		stopped: make(chan struct{}),
		quit:    make(chan struct{}),
		readyCh: make(chan struct{}),

		cancelGrace: CancelGrace,
	}
	c.tunnels = NewTunnels(
		func(d *runnerv1.EgressData) error {
			return c.sendRaw(&runnerv1.Request{Kind: &runnerv1.Request_EgressData{EgressData: d}})
		},
		func(cl *runnerv1.EgressClose) error {
			return c.sendRaw(&runnerv1.Request{Kind: &runnerv1.Request_EgressClose{EgressClose: cl}})
		})
	go c.read(bufio.NewReaderSize(r, 64<<10))
	return c
}

func (c *Client) read(r io.Reader) {
	defer close(c.stopped)
	defer close(c.events)
	defer c.tunnels.CloseAll("the runner's stream ended")
	for {
		ev := new(runnerv1.Event)
		if err := ReadFrame(r, ev); err != nil {
			c.readErr = err
			return
		}
		switch k := ev.GetKind().(type) {
		case *runnerv1.Event_EgressData:
			c.tunnels.Deliver(k.EgressData)
			continue
		case *runnerv1.Event_EgressClose:
			c.tunnels.Closed(k.EgressClose)
			continue
		case *runnerv1.Event_EgressOpen:
			c.egressOpen(ev.GetId(), k.EgressOpen)
			continue
		}
		if ready := ev.GetReady(); ready != nil {
			c.readyOnce.Do(func() {
				c.ready = ready
				c.prestarted.Store(&Prestart{Language: ready.GetPrestarted(), Forked: ready.GetPrestartedForked()})
				close(c.readyCh)
			})
			continue
		}
		select {
		case c.events <- ev:
		case <-c.quit:
			c.readErr = ErrClosed
			return
		}
	}
}

// Close stops the client: calls in progress end with an error wrapping
// [ErrRunnerGone] and [ErrClosed], later calls fail with ErrClosed. It does
// not close the underlying streams. Close always returns nil.
func (c *Client) Close() error {
	c.closeOnce.Do(func() { close(c.quit) })
	return nil
}

// Ready waits for the runner's Ready event, which it sends once when it
// starts, and returns it. It may be called any number of times, also after
// other calls.
//
// # Errors
//
// ctx's error if ctx ends first; an error wrapping [ErrRunnerGone] if the
// stream ends first.
func (c *Client) Ready(ctx context.Context) (*runnerv1.Ready, error) {
	select {
	case <-c.readyCh:
		return c.ready, nil
	default:
	}
	select {
	case <-c.readyCh:
		return c.ready, nil
	case <-c.stopped:
		select {
		case <-c.readyCh:
			return c.ready, nil
		default:
		}
		return nil, c.gone()
	case <-ctx.Done():
		return nil, fmt.Errorf("wait for runner ready: %w", ctx.Err())
	}
}

// Run runs a program and waits for it to end. Chunks of its stdout and
// stderr are passed to out (if not nil) as they arrive, in the order the
// runner read them; out runs on the calling goroutine, may keep chunk, and
// slows the run down if it blocks (the runner's pipes fill up).
//
// The runner enforces run's timeout and output limit itself and reports them
// in the Exit. If ctx ends before the run does, Run sends a Cancel, waits up
// to [CancelGrace] for the Exit, and returns it together with an error
// wrapping ctx's error.
//
// Files in run that would make the request larger than [MaxFrameSize] are
// sent ahead of it with WriteFile requests, transparently.
//
// # Errors
//
//   - a [*RunnerError] if the runner refused the run (unknown language, a bad
//     file path, another request in progress);
//   - an error wrapping [ErrRunnerGone] if the stream broke, the runner sent
//     something out of protocol, or the Exit did not come within CancelGrace
//     of the cancellation;
//   - ctx's error, wrapped, if ctx ended (together with the Exit, if any).
func (c *Client) Run(ctx context.Context, run *runnerv1.Run, out func(stream Stream, chunk []byte)) (*runnerv1.Exit, error) {
	return c.RunEgress(ctx, run, out, nil)
}

// RunEgress is [Client.Run] for a run whose programs may reach outside the
// sandbox through the runner's egress proxy, as egress decides; with nil
// egress every connection is refused. The run's connections are closed
// when it ends.
func (c *Client) RunEgress(ctx context.Context, run *runnerv1.Run, out func(stream Stream, chunk []byte), egress Egress) (*runnerv1.Exit, error) {
	if err := c.acquire(ctx); err != nil {
		return nil, err
	}
	defer c.release()

	if proto.Size(run) > MaxFrameSize-1024 {
		for _, f := range run.GetFiles() {
			if err := c.writeFile(ctx, f); err != nil {
				return nil, err
			}
		}
		run = proto.CloneOf(run)
		run.Files = nil
	}

	id := c.newID()
	if egress != nil {
		ectx, cancel := context.WithCancel(ctx)
		c.egress.Store(&runEgress{run: id, e: egress, ctx: ectx})
		defer func() {
			c.egress.Store(nil)
			cancel()
			c.tunnels.CloseAll("the run ended")
		}()
	}
	if err := c.send(&runnerv1.Request{Id: id, Kind: &runnerv1.Request_Run{Run: run}}); err != nil {
		return nil, err
	}
	var (
		done      = ctx.Done()
		cancelled error
		grace     <-chan time.Time
	)
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				return nil, c.fail(c.gone())
			}
			if ev.GetId() != id {
				continue // the answer of an earlier, abandoned request
			}
			switch k := ev.GetKind().(type) {
			case *runnerv1.Event_Stdout:
				if out != nil {
					out(Stdout, k.Stdout)
				}
			case *runnerv1.Event_Stderr:
				if out != nil {
					out(Stderr, k.Stderr)
				}
			case *runnerv1.Event_Exit:
				if cancelled != nil {
					return k.Exit, fmt.Errorf("run cancelled: %w", cancelled)
				}
				return k.Exit, nil
			case *runnerv1.Event_Error:
				return nil, remoteError(k.Error)
			default:
				return nil, c.fail(fmt.Errorf("%w: unexpected %T event for a run", ErrRunnerGone, k))
			}
		case <-done:
			done, cancelled = nil, ctx.Err()
			cancel := &runnerv1.Request{Id: c.newID(), Kind: &runnerv1.Request_Cancel{Cancel: &runnerv1.Cancel{RunId: id}}}
			if err := c.send(cancel); err != nil {
				return nil, err
			}
			t := time.NewTimer(c.cancelGrace)
			defer t.Stop()
			grace = t.C
		case <-grace:
			return nil, c.fail(fmt.Errorf("%w: run did not end within %v of its cancellation", ErrRunnerGone, c.cancelGrace))
		}
	}
}

// Reset kills every process of user code, empties /workspace, /tmp and
// /dev/shm, and removes the user's System V IPC objects and POSIX message
// queues, so that the sandbox can serve an unrelated run. Interpreter state
// of stateful runs is dropped too.
//
// # Errors
//
// A [*RunnerError] if the runner could not make the sandbox clean (the
// sandbox must then be destroyed, not reused), or the errors described on
// [Client].
func (c *Client) Reset(ctx context.Context) error {
	c.prestarted.Store(&Prestart{}) // until the runner says otherwise
	ev, err := c.call(ctx, &runnerv1.Request{Kind: &runnerv1.Request_Reset_{Reset_: &runnerv1.Reset{}}})
	if err != nil {
		return err
	}
	c.prestarted.Store(&Prestart{Language: ev.GetDone().GetPrestarted(), Forked: ev.GetDone().GetPrestartedForked()})
	return nil
}

// Prestart is the interpreter a runner keeps started ahead of the next
// stateless run.
type Prestart struct {
	// Language is its language; "": none.
	Language string
	// Forked says it is forked from the language's preloaded parent, its
	// modules imported, rather than fresh.
	Forked bool
}

// Prestarted is the interpreter the runner has started ahead of the next
// stateless run, as it said when it became ready or at the end of the last
// Reset; the zero Prestart if none (or not known yet). A run of another
// language, or anything but a stateless run, discards it.
func (c *Client) Prestarted() Prestart {
	if p := c.prestarted.Load(); p != nil {
		return *p
	}
	return Prestart{}
}

// WriteFile writes f into the workspace, creating its parent directories,
// owned by [UserUID]. f.Path is relative to /workspace; it must not leave it,
// also not through a symbolic link.
//
// # Errors
//
// A [*RunnerError] matching [ErrInvalidArgument] for a bad path,
// [ErrResourceExhausted] for content above [MaxFileSize] or a full
// workspace, [ErrFailedPrecondition] if a directory is in the way.
func (c *Client) WriteFile(ctx context.Context, f *runnerv1.File) error {
	if err := c.acquire(ctx); err != nil {
		return err
	}
	defer c.release()
	return c.writeFile(ctx, f)
}

// writeFile is WriteFile for a caller that holds sem.
func (c *Client) writeFile(ctx context.Context, f *runnerv1.File) error {
	if n := len(f.GetContent()); n > MaxFileSize {
		return &RunnerError{
			Code:    runnerv1.Error_CODE_RESOURCE_EXHAUSTED,
			Message: fmt.Sprintf("file %q has %d bytes, more than the limit of %d", f.GetPath(), n, MaxFileSize),
		}
	}
	_, err := c.exchange(ctx, &runnerv1.Request{Kind: &runnerv1.Request_WriteFile{WriteFile: &runnerv1.WriteFile{File: f}}})
	return err
}

// ReadFile reads a regular file of the workspace. max bounds its size; 0
// means [MaxFileSize], and larger values are lowered to it.
//
// # Errors
//
// A [*RunnerError] matching [ErrNotFound] if there is no such file,
// [ErrResourceExhausted] if it is larger than max, [ErrFailedPrecondition]
// if it is not a regular file, [ErrInvalidArgument] for a bad path.
func (c *Client) ReadFile(ctx context.Context, path string, max uint64) (*runnerv1.File, error) {
	ev, err := c.call(ctx, &runnerv1.Request{Kind: &runnerv1.Request_ReadFile{ReadFile: &runnerv1.ReadFile{Path: path, MaxBytes: max}}})
	if err != nil {
		return nil, err
	}
	f := ev.GetFile()
	if f == nil {
		return nil, c.protocolError(ev)
	}
	return f, nil
}

// ListFiles lists one directory of the workspace (not recursively); path ""
// is /workspace itself. Entries are sorted by path. Use [Client.List] to
// learn whether the list was cut short.
func (c *Client) ListFiles(ctx context.Context, path string) ([]*runnerv1.FileInfo, error) {
	l, err := c.List(ctx, path)
	if err != nil {
		return nil, err
	}
	return l.GetFiles(), nil
}

// List is [Client.ListFiles] returning the whole answer, whose Truncated
// says whether the directory had more entries than the runner lists.
func (c *Client) List(ctx context.Context, path string) (*runnerv1.FileList, error) {
	ev, err := c.call(ctx, &runnerv1.Request{Kind: &runnerv1.Request_ListFiles{ListFiles: &runnerv1.ListFiles{Path: path}}})
	if err != nil {
		return nil, err
	}
	l := ev.GetFileList()
	if l == nil {
		return nil, c.protocolError(ev)
	}
	return l, nil
}

// call sends req (assigning its id) and returns the event that answers it.
func (c *Client) call(ctx context.Context, req *runnerv1.Request) (*runnerv1.Event, error) {
	if err := c.acquire(ctx); err != nil {
		return nil, err
	}
	defer c.release()
	return c.exchange(ctx, req)
}

// exchange is call for a caller that holds sem. Reset expects Done, and the
// other requests their own kind of answer; an Error becomes a *RunnerError.
func (c *Client) exchange(ctx context.Context, req *runnerv1.Request) (*runnerv1.Event, error) {
	id := c.newID()
	req.Id = id
	if err := c.send(req); err != nil {
		return nil, err
	}
	ev, err := c.await(ctx, id)
	if err != nil {
		return nil, err
	}
	if e := ev.GetError(); e != nil {
		return nil, remoteError(e)
	}
	switch req.GetKind().(type) {
	case *runnerv1.Request_Reset_, *runnerv1.Request_WriteFile:
		if ev.GetDone() == nil {
			return nil, c.protocolError(ev)
		}
	}
	return ev, nil
}

// await returns the first event of request id. If ctx ends first, the
// request is left pending for the next call to finish.
func (c *Client) await(ctx context.Context, id uint64) (*runnerv1.Event, error) {
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				return nil, c.fail(c.gone())
			}
			if ev.GetId() == id {
				return ev, nil
			}
		case <-ctx.Done():
			c.pending = id
			return nil, fmt.Errorf("wait for runner: %w", ctx.Err())
		}
	}
}

// acquire takes the client's turn, then consumes the answer of an earlier
// abandoned request, if any.
func (c *Client) acquire(ctx context.Context) error {
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("wait for runner: %w", ctx.Err())
	}
	if c.broken != nil {
		c.release()
		return c.broken
	}
	select {
	case <-c.quit:
		c.release()
		return ErrClosed
	default:
	}
	if id := c.pending; id != 0 {
		if _, err := c.await(ctx, id); err != nil {
			c.release()
			return err
		}
		c.pending = 0
	}
	return nil
}

func (c *Client) release() { <-c.sem }

// newID returns a fresh request id; the caller holds sem.
func (c *Client) newID() uint64 {
	c.nextID++
	return c.nextID
}

// egressOpen answers the runner's EgressOpen for a connection of run. It
// does not block the reader: the decision and the dial happen on a
// goroutine of their own.
func (c *Client) egressOpen(run uint64, open *runnerv1.EgressOpen) {
	re := c.egress.Load()
	if re == nil || re.run != run {
		c.answerEgress(open.GetConn(), &EgressRefusal{Status: 403, Reason: "this run may not reach anything outside its sandbox"})
		return
	}
	go func() {
		serve, err := re.e.Open(re.ctx, open.GetHost(), open.GetPort())
		if err != nil {
			c.answerEgress(open.GetConn(), err)
			return
		}
		t, err := c.tunnels.Open(open.GetConn(), EgressAddr{Host: "sandbox"}, EgressAddr{Host: open.GetHost(), Port: open.GetPort()})
		if err != nil {
			c.answerEgress(open.GetConn(), &EgressRefusal{Status: 502, Reason: err.Error()})
			return
		}
		if re.ctx.Err() != nil { // the run ended meanwhile
			t.Close()
			return
		}
		if err := c.sendRaw(&runnerv1.Request{Kind: &runnerv1.Request_EgressAnswer{EgressAnswer: &runnerv1.EgressAnswer{Conn: open.GetConn()}}}); err != nil {
			t.Close()
			return
		}
		serve(t)
	}()
}

func (c *Client) answerEgress(conn uint64, err error) {
	a := &runnerv1.EgressAnswer{Conn: conn, Status: 502, Reason: err.Error()}
	var r *EgressRefusal
	if errors.As(err, &r) {
		a.Status, a.Reason = uint32(r.Status), r.Reason
	}
	// A failure to send is the stream breaking, which the reader sees.
	_ = c.sendRaw(&runnerv1.Request{Kind: &runnerv1.Request_EgressAnswer{EgressAnswer: a}})
}

// sendRaw writes one frame, for egress traffic, which flows beside the
// request being served and does not hold the client's turn.
func (c *Client) sendRaw(req *runnerv1.Request) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return WriteFrame(c.w, req)
}

func (c *Client) send(req *runnerv1.Request) error {
	c.wmu.Lock()
	err := WriteFrame(c.w, req)
	c.wmu.Unlock()
	if err == nil {
		return nil
	}
	if errors.Is(err, ErrFrameTooLarge) {
		// Nothing was written: the stream is intact.
		return &RunnerError{Code: runnerv1.Error_CODE_RESOURCE_EXHAUSTED, Message: "request too large: " + err.Error()}
	}
	return c.fail(fmt.Errorf("%w: send request: %w", ErrRunnerGone, err))
}

// gone describes why the reader stopped; call it after stopped is closed.
func (c *Client) gone() error {
	<-c.stopped
	return fmt.Errorf("%w: %w", ErrRunnerGone, c.readErr)
}

// fail marks the client broken with err (which wraps ErrRunnerGone) and
// stops the reader. The caller holds sem.
func (c *Client) fail(err error) error {
	c.broken = err
	c.closeOnce.Do(func() { close(c.quit) })
	return err
}

func (c *Client) protocolError(ev *runnerv1.Event) error {
	return c.fail(fmt.Errorf("%w: unexpected %T answer", ErrRunnerGone, ev.GetKind()))
}
