package wire

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// peer is the runner's end of a client's streams. The runner itself is
// tested in its own package; here the peer scripts answers, including the
// broken ones a real runner should never send.
type peer struct {
	t    *testing.T
	reqs *bufio.Reader  // requests from the client
	evw  *io.PipeWriter // events to the client
	reqr *io.PipeReader
}

func newPair(t *testing.T) (*Client, *peer) {
	t.Helper()
	reqr, reqw := io.Pipe()
	evr, evw := io.Pipe()
	c := NewClient(evr, reqw)
	c.cancelGrace = 200 * time.Millisecond
	p := &peer{t: t, reqs: bufio.NewReader(reqr), evw: evw, reqr: reqr}
	t.Cleanup(func() {
		c.Close()
		evw.Close()
		reqr.Close()
	})
	return c, p
}

func (p *peer) next() *runnerv1.Request {
	var req runnerv1.Request
	if err := ReadFrame(p.reqs, &req); err != nil {
		p.t.Errorf("peer: read request: %v", err)
		return nil
	}
	return &req
}

func (p *peer) send(ev *runnerv1.Event) {
	if err := WriteFrame(p.evw, ev); err != nil {
		p.t.Errorf("peer: send %v: %v", ev, err)
	}
}

func TestClientReady(t *testing.T) {
	t.Parallel()
	c, p := newPair(t)
	go p.send(&runnerv1.Event{Kind: &runnerv1.Event_Ready{Ready: &runnerv1.Ready{Versions: map[string]string{"python": "3.11.2"}}}})
	for range 2 {
		r, err := c.Ready(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if got := r.GetVersions()["python"]; got != "3.11.2" {
			t.Fatalf("python version %q", got)
		}
	}
}

func TestClientReadyGone(t *testing.T) {
	t.Parallel()
	c, p := newPair(t)
	p.evw.Close()
	if _, err := c.Ready(t.Context()); !errors.Is(err, ErrRunnerGone) {
		t.Fatalf("Ready = %v, want ErrRunnerGone", err)
	}
}

func TestClientReadyContext(t *testing.T) {
	t.Parallel()
	c, _ := newPair(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Ready(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ready = %v, want DeadlineExceeded", err)
	}
}

type chunk struct {
	stream Stream
	data   string
}

func TestClientRun(t *testing.T) {
	t.Parallel()
	c, p := newPair(t)
	go func() {
		// Ready may come at any time, also in the middle of an exchange.
		p.send(&runnerv1.Event{Kind: &runnerv1.Event_Ready{Ready: &runnerv1.Ready{}}})
		req := p.next()
		if req.GetRun().GetCode() != "print(1)" {
			t.Errorf("peer got %v", req)
		}
		id := req.GetId()
		p.send(&runnerv1.Event{Id: id + 100, Kind: &runnerv1.Event_Stdout{Stdout: []byte("stale")}})
		p.send(&runnerv1.Event{Id: id, Kind: &runnerv1.Event_Stdout{Stdout: []byte("a")}})
		p.send(&runnerv1.Event{Id: id, Kind: &runnerv1.Event_Stderr{Stderr: []byte("b")}})
		p.send(&runnerv1.Event{Id: id, Kind: &runnerv1.Event_Stdout{Stdout: []byte("c")}})
		p.send(&runnerv1.Event{Id: id, Kind: &runnerv1.Event_Exit{Exit: &runnerv1.Exit{Code: 3, Truncated: true}}})
	}()
	var got []chunk
	exit, err := c.Run(t.Context(), &runnerv1.Run{Language: "python", Code: "print(1)"}, func(s Stream, b []byte) {
		got = append(got, chunk{s, string(b)})
	})
	if err != nil {
		t.Fatal(err)
	}
	if exit.GetCode() != 3 || !exit.GetTruncated() {
		t.Fatalf("exit = %v", exit)
	}
	want := []chunk{{Stdout, "a"}, {Stderr, "b"}, {Stdout, "c"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("chunks = %v, want %v", got, want)
	}
}

func TestClientRunCancel(t *testing.T) {
	t.Parallel()
	c, p := newPair(t)
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		run := p.next()
		p.send(&runnerv1.Event{Id: run.GetId(), Kind: &runnerv1.Event_Stdout{Stdout: []byte("started")}})
		cl := p.next()
		if cl.GetCancel().GetRunId() != run.GetId() || cl.GetId() == run.GetId() {
			t.Errorf("peer got %v after run %d, want its Cancel with a fresh id", cl, run.GetId())
		}
		p.send(&runnerv1.Event{Id: run.GetId(), Kind: &runnerv1.Event_Exit{Exit: &runnerv1.Exit{Code: 137}}})
	}()
	exit, err := c.Run(ctx, &runnerv1.Run{Language: "bash", Code: "sleep 10"}, func(Stream, []byte) { cancel() })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if exit.GetCode() != 137 {
		t.Fatalf("exit = %v, want the runner's Exit", exit)
	}
}

func TestClientRunCancelUnanswered(t *testing.T) {
	t.Parallel()
	c, p := newPair(t)
	ctx, cancel := context.WithCancel(t.Context())
	go func() {
		p.next()
		cancel()
		p.next() // the Cancel, which this peer ignores
	}()
	_, err := c.Run(ctx, &runnerv1.Run{Language: "bash", Code: "sleep 10"}, nil)
	if !errors.Is(err, ErrRunnerGone) {
		t.Fatalf("Run = %v, want ErrRunnerGone", err)
	}
	if err2 := c.Reset(t.Context()); !errors.Is(err2, ErrRunnerGone) {
		t.Fatalf("Reset after a broken run = %v, want ErrRunnerGone", err2)
	}
}

func TestClientRunStreamBreaks(t *testing.T) {
	t.Parallel()
	c, p := newPair(t)
	go func() {
		req := p.next()
		p.send(&runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_Stdout{Stdout: []byte("x")}})
		p.evw.CloseWithError(errors.New("sandbox died"))
	}()
	var out bytes.Buffer
	_, err := c.Run(t.Context(), &runnerv1.Run{Language: "python", Code: "1"}, func(_ Stream, b []byte) { out.Write(b) })
	if !errors.Is(err, ErrRunnerGone) {
		t.Fatalf("Run = %v, want ErrRunnerGone", err)
	}
	if out.String() != "x" {
		t.Fatalf("output before the break = %q", out.String())
	}
	if _, err := c.ReadFile(t.Context(), "a", 0); !errors.Is(err, ErrRunnerGone) {
		t.Fatalf("ReadFile after the break = %v, want ErrRunnerGone", err)
	}
}

func TestClientRunnerErrors(t *testing.T) {
	t.Parallel()
	codes := []struct {
		code runnerv1.Error_Code
		want error
	}{
		{runnerv1.Error_CODE_INVALID_ARGUMENT, ErrInvalidArgument},
		{runnerv1.Error_CODE_NOT_FOUND, ErrNotFound},
		{runnerv1.Error_CODE_RESOURCE_EXHAUSTED, ErrResourceExhausted},
		{runnerv1.Error_CODE_BUSY, ErrBusy},
		{runnerv1.Error_CODE_FAILED_PRECONDITION, ErrFailedPrecondition},
	}
	c, p := newPair(t)
	go func() {
		for _, tc := range codes {
			req := p.next()
			p.send(&runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_Error{Error: &runnerv1.Error{Code: tc.code, Message: "no"}}})
		}
		req := p.next()
		p.send(&runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_Done{Done: &runnerv1.Done{}}})
	}()
	for _, tc := range codes {
		_, err := c.ReadFile(t.Context(), "x", 0)
		var re *RunnerError
		if !errors.As(err, &re) || !errors.Is(err, tc.want) || re.Message != "no" {
			t.Fatalf("code %v: err = %v, want %v", tc.code, err, tc.want)
		}
		for _, other := range codes {
			if other.want != tc.want && errors.Is(err, other.want) {
				t.Fatalf("code %v matches %v too", tc.code, other.want)
			}
		}
	}
	// The client is still usable after refused requests.
	if err := c.Reset(t.Context()); err != nil {
		t.Fatalf("Reset = %v", err)
	}
}

func TestClientFiles(t *testing.T) {
	t.Parallel()
	c, p := newPair(t)
	go func() {
		req := p.next()
		if f := req.GetWriteFile().GetFile(); f.GetPath() != "d/a.txt" || string(f.GetContent()) != "hi" {
			t.Errorf("peer got %v", req)
		}
		p.send(&runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_Done{Done: &runnerv1.Done{}}})
		req = p.next()
		if r := req.GetReadFile(); r.GetPath() != "d/a.txt" || r.GetMaxBytes() != 10 {
			t.Errorf("peer got %v", req)
		}
		p.send(&runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_File{File: &runnerv1.File{Path: "d/a.txt", Content: []byte("hi")}}})
		req = p.next()
		p.send(&runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_FileList{FileList: &runnerv1.FileList{Files: []*runnerv1.FileInfo{{Path: "d/a.txt", Size: 2}}, Truncated: true}}})
		req = p.next()
		// A wrong kind of answer is a protocol violation.
		p.send(&runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_Done{Done: &runnerv1.Done{}}})
	}()
	ctx := t.Context()
	if err := c.WriteFile(ctx, &runnerv1.File{Path: "d/a.txt", Content: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	f, err := c.ReadFile(ctx, "d/a.txt", 10)
	if err != nil || string(f.GetContent()) != "hi" {
		t.Fatalf("ReadFile = %v, %v", f, err)
	}
	l, err := c.List(ctx, "d")
	if err != nil || len(l.GetFiles()) != 1 || !l.GetTruncated() {
		t.Fatalf("List = %v, %v", l, err)
	}
	if _, err := c.ListFiles(ctx, "d"); !errors.Is(err, ErrRunnerGone) {
		t.Fatalf("ListFiles answered with Done = %v, want ErrRunnerGone", err)
	}
}

func TestClientWriteFileTooLarge(t *testing.T) {
	t.Parallel()
	c, _ := newPair(t)
	err := c.WriteFile(t.Context(), &runnerv1.File{Path: "big", Content: make([]byte, MaxFileSize+1)})
	if !errors.Is(err, ErrResourceExhausted) {
		t.Fatalf("WriteFile = %v, want ErrResourceExhausted", err)
	}
}

// A run whose files do not fit in one frame sends them ahead with WriteFile.
func TestClientRunLargeFiles(t *testing.T) {
	t.Parallel()
	c, p := newPair(t)
	files := []*runnerv1.File{
		{Path: "a", Content: bytes.Repeat([]byte("a"), MaxFileSize)},
		{Path: "b", Content: bytes.Repeat([]byte("b"), MaxFileSize)},
		{Path: "c", Content: []byte("c")},
	}
	go func() {
		for _, want := range files {
			req := p.next()
			if !proto.Equal(req.GetWriteFile().GetFile(), want) {
				t.Errorf("peer got %d bytes of %q, want WriteFile %q", proto.Size(req), req.GetWriteFile().GetFile().GetPath(), want.GetPath())
			}
			p.send(&runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_Done{Done: &runnerv1.Done{}}})
		}
		req := p.next()
		if r := req.GetRun(); r.GetCode() != "ls" || len(r.GetFiles()) != 0 || !r.GetStateful() || r.GetMemoryLimit() != 5 {
			t.Errorf("peer got run %v", r)
		}
		p.send(&runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_Exit{Exit: &runnerv1.Exit{}}})
	}()
	if _, err := c.Run(t.Context(), &runnerv1.Run{Language: "bash", Code: "ls", Stateful: true, MemoryLimit: 5, Files: files}, nil); err != nil {
		t.Fatal(err)
	}
}

// A call whose context ends leaves its answer pending; the next call
// consumes it before it sends its own request.
func TestClientAbandonedAnswer(t *testing.T) {
	t.Parallel()
	c, p := newPair(t)
	ctx, cancel := context.WithCancel(t.Context())
	abandoned := make(chan struct{})
	go func() {
		first := p.next()
		cancel()
		<-abandoned
		p.send(&runnerv1.Event{Id: first.GetId(), Kind: &runnerv1.Event_File{File: &runnerv1.File{Path: "first"}}})
		second := p.next()
		p.send(&runnerv1.Event{Id: second.GetId(), Kind: &runnerv1.Event_File{File: &runnerv1.File{Path: "second"}}})
	}()
	if _, err := c.ReadFile(ctx, "first", 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("first ReadFile = %v, want Canceled", err)
	}
	close(abandoned)
	f, err := c.ReadFile(t.Context(), "second", 0)
	if err != nil || f.GetPath() != "second" {
		t.Fatalf("second ReadFile = %v, %v", f, err)
	}
}

func TestClientSerializes(t *testing.T) {
	t.Parallel()
	c, p := newPair(t)
	const n = 20
	go func() {
		for range n {
			req := p.next()
			if req == nil {
				return
			}
			// The client must not send another request before this answer.
			p.send(&runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_File{File: &runnerv1.File{Path: req.GetReadFile().GetPath()}}})
		}
	}()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			path := fmt.Sprint(i)
			f, err := c.ReadFile(t.Context(), path, 0)
			if err != nil || f.GetPath() != path {
				t.Errorf("ReadFile(%s) = %v, %v", path, f, err)
			}
		})
	}
	wg.Wait()
}

func TestClientClose(t *testing.T) {
	t.Parallel()
	c, _ := newPair(t)
	c.Close()
	if err := c.Reset(t.Context()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Reset after Close = %v, want ErrClosed", err)
	}
}
