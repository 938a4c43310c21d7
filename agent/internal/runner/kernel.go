package runner

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/agent/internal/runner/proc"
	"github.com/codemode-go/codemode/agent/internal/runner/stdio"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// kernel is a resident python3 process, running as the user, that executes
// the cells of stateful Python runs in one namespace (see kernel.py for its
// side of the protocol).
type kernel struct {
	proc *proc.Proc
	sock *os.File // the runner's end of the control socket
}

func (k *kernel) alive() bool { return k.proc.Alive() }

// stop kills the kernel and everything in its process group.
func (k *kernel) stop() {
	proc.KillGroup(k.proc.Pid)
	k.sock.Close()
	<-k.proc.Done()
}

func (s *server) startKernel(lang language) (*kernel, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("create kernel socket: %w", err)
	}
	parent, child := os.NewFile(uintptr(fds[0]), "kernel"), os.NewFile(uintptr(fds[1]), "kernel-child")
	// From the preloaded parent when there is one, so that the session's
	// first cell finds the modules imported.
	p, ok := s.forkKernel(lang, []*os.File{nil, nil, nil, child})
	if !ok {
		p, err = s.procs.Start(proc.Spec{
			Argv:  lang.Kernel,
			Env:   s.env(lang),
			Files: []*os.File{nil, nil, nil, child},
		})
	}
	child.Close()
	if err != nil {
		parent.Close()
		return nil, fmt.Errorf("start python kernel: %w", err)
	}
	return &kernel{proc: p, sock: parent}, nil
}

// killKernel stops the Python kernel, if there is one.
func (s *server) killKernel() {
	if s.kernel != nil {
		s.kernel.stop()
		s.kernel = nil
	}
}

const stateLostNote = "\n[codemode] the Python session's state (variables, imports, functions) was lost: %s; the next run starts a fresh interpreter\n"

// interruptedNote ends the output of a cell that was interrupted.
const interruptedNote = "\n[codemode] the run %s and was interrupted (KeyboardInterrupt); the Python session's state is kept\n"

// interruptGrace is how long a cell that timed out or was cancelled has to
// end once interrupted before the interpreter is killed: half the agent's
// wait for the runner's report after a timeout (2 s), and long enough for
// a sandbox on a loaded host to raise KeyboardInterrupt (500 ms was not,
// once in a CI run, losing a session's state that was to be kept).
const interruptGrace = time.Second

// runKernel runs one cell in the Python kernel, starting one if needed.
func (s *server) runKernel(ctx context.Context, o *stdio.Output, lang language, r *runnerv1.Run, lim limits) (*runnerv1.Exit, error) {
	start := time.Now()
	k, err := s.liveKernel(lang)
	if err != nil {
		return nil, err
	}
	std, err := stdio.NewPipes(r.GetStdin(), false)
	if err != nil {
		return nil, err
	}
	if sent, err := k.send(std, r.GetCode()); err != nil {
		return nil, err
	} else if !sent {
		s.killKernel()
		o.Note(fmt.Sprintf(stateLostNote, "the interpreter could not take the code"))
		return &runnerv1.Exit{Code: 1, StateLost: true, Duration: durationpb.New(time.Since(start))}, nil
	}
	std.Start(o)
	c := k.await()
	lim.interrupt = s.interruptCell(k, c)
	st := s.supervise(ctx, c.done, k.proc.Pid, k.proc.Done(), lim, 0)
	exit := s.cellExit(o, k, c, st)
	exit.Duration = durationpb.New(time.Since(start))
	return exit, st.err
}

// liveKernel returns the session's kernel, started (again) if there is none
// or it died.
func (s *server) liveKernel(lang language) (*kernel, error) {
	if s.kernel != nil && !s.kernel.alive() {
		s.killKernel()
	}
	if s.kernel == nil {
		k, err := s.startKernel(lang)
		if err != nil {
			return nil, err
		}
		s.kernel = k
	}
	return s.kernel, nil
}

// send hands the kernel a cell: its standard streams (std's child ends,
// which it closes) as file descriptors, then its code. sent is false if
// the kernel could not take it; std's parent ends are then closed, as on
// an error.
func (k *kernel) send(std *stdio.Pipes, code string) (sent bool, err error) {
	child := std.Child()
	if child[0] == nil {
		if child[0], err = os.Open(os.DevNull); err != nil {
			std.CloseChild()
			std.CloseParent()
			return false, fmt.Errorf("open %s: %w", os.DevNull, err)
		}
		defer child[0].Close()
	}
	head := binary.BigEndian.AppendUint32(nil, uint32(len(code)))
	rights := syscall.UnixRights(int(child[0].Fd()), int(child[1].Fd()), int(child[2].Fd()))
	err = syscall.Sendmsg(int(k.sock.Fd()), head, rights, nil, 0)
	if err == nil {
		_, err = k.sock.Write([]byte(code))
	}
	std.CloseChild()
	if err != nil {
		std.CloseParent()
		return false, nil
	}
	return true, nil
}

// cell is a cell the kernel runs.
type cell struct {
	// done is closed when the kernel reports the cell's exit code, or
	// when the kernel dies (its end of the socket closes).
	done chan struct{}
	// result is the exit code the kernel reported, big-endian; nil: none.
	// Set before done is closed.
	result []byte
}

// await waits, in its own goroutine, for the end of the cell just sent.
func (k *kernel) await() *cell {
	c := &cell{done: make(chan struct{})}
	go func() {
		defer close(c.done)
		b := make([]byte, 4)
		if _, err := io.ReadFull(k.sock, b); err == nil {
			c.result = b
		}
	}()
	return c
}

// interruptCell is how a cell that times out or is cancelled is interrupted
// first, as in a notebook, so that the session keeps its state; the
// processes it leaves are killed. One that does not end when interrupted is
// killed with the interpreter.
func (s *server) interruptCell(k *kernel, c *cell) func(done <-chan struct{}) bool {
	return func(done <-chan struct{}) bool {
		if err := syscall.Kill(k.proc.Pid, syscall.SIGINT); err != nil {
			return false
		}
		select {
		case <-done:
		case <-time.After(interruptGrace):
			return false
		}
		if c.result == nil {
			return false
		}
		// The cell ended; the processes it left go, as when a run is
		// killed, and only the kernel stays.
		if err := s.procs.KillUser([]int{k.proc.Pid}); err != nil {
			return false
		}
		return s.procs.KillGroupBut(k.proc.Pid, k.proc.Pid) == nil
	}
}

// cellExit is the Exit of cell c, which st stopped or not, once its output
// is delivered, with a note on stderr if it was interrupted or the session's
// state was lost.
func (s *server) cellExit(o *stdio.Output, k *kernel, c *cell, st stopped) *runnerv1.Exit {
	exit := &runnerv1.Exit{TimedOut: st.timedOut, OomKilled: st.oom}
	if c.result != nil && (st.interrupted || !st.timedOut && !st.cancelled && !st.oom) {
		exit.Code = int32(binary.BigEndian.Uint32(c.result))
		if st.interrupted {
			why := "was cancelled"
			if st.timedOut {
				why = "reached its timeout"
			}
			o.Note(fmt.Sprintf(interruptedNote, why))
		}
	} else {
		// The kernel is dead or being killed: wait for it to report how it
		// ended.
		s.killKernel()
		exit.Code = proc.ExitCode(k.proc.Status())
		exit.OomKilled = exit.OomKilled || st.diedOfMemory(k.proc.Status())
		exit.StateLost = true
	}
	exit.Truncated = o.Finish(s.cfg.drainGrace)
	if exit.StateLost {
		why := "the interpreter exited"
		switch {
		case st.timedOut:
			why = "the interpreter was killed at the timeout"
		case exit.OomKilled:
			why = "the interpreter was killed for using too much memory"
		case st.cancelled:
			why = "the run was cancelled"
		}
		o.Note(fmt.Sprintf(stateLostNote, why))
	}
	return exit
}
