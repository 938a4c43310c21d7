package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/codemode-go/codemode/agent/internal/sandbox"
	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// Sandbox is a started container whose runner has said it is ready. It is
// owned by one holder at a time (the pool, a stateless run, or a session);
// its methods are safe for concurrent use, but runs are served one at a time.
type Sandbox struct {
	c       sandbox.Container
	rc      *wire.Client
	ready   *runnerv1.Ready
	memory  int64
	created time.Time
	image   string // the id of the image it was created from

	// uses counts the runs served; only the holder touches it.
	uses int
	// retireAt is the runs it serves before it is destroyed, at most
	// Config.MaxReuse (see wear.go); set when it is made.
	retireAt int
	// idleSince is when it last joined the warm list; guarded by the pool.
	idleSince time.Time
	// dedicated sandboxes (made for a non-default memory limit) are never
	// recycled.
	dedicated bool
	// died: its runner went away during a request (see DiedError); only
	// the holder touches it.
	died bool
	// lane is the index of its CPU set in Config.CPUSets, -1 if none.
	lane int
	// held: taken by a session; guarded by the pool.
	held bool

	p *Pool
}

// ID is the container's id.
func (s *Sandbox) ID() string { return s.c.ID() }

// dead reports whether the sandbox's stream has ended.
func (s *Sandbox) dead() bool {
	select {
	case <-s.c.Done():
		return true
	default:
		return false
	}
}

// Prestarted is the interpreter the runner keeps started ahead of the
// next stateless run (see [wire.Client.Prestarted]).
func (s *Sandbox) Prestarted() wire.Prestart { return s.rc.Prestarted() }

// Versions are the interpreter versions the runner reported when it started.
func (s *Sandbox) Versions() map[string]string { return s.ready.GetVersions() }

// Run runs one program in the sandbox, its egress decided by egress (nil:
// none); see [wire.Client.RunEgress].
//
// If the runner goes away during the run, the error is a [*DiedError],
// which says why, and the pool destroys the sandbox when it is given back.
func (s *Sandbox) Run(ctx context.Context, run *runnerv1.Run, out func(wire.Stream, []byte), egress wire.Egress) (*runnerv1.Exit, error) {
	s.uses++
	if !run.GetStateful() {
		s.p.demand.noteRun(s.p.cfg.NamesPreloaded, run.GetLanguage(), run.GetCode())
	}
	exit, err := s.rc.RunEgress(ctx, run, out, egress)
	if errors.Is(err, wire.ErrRunnerGone) {
		return exit, s.p.died(ctx, s, err)
	}
	return exit, err
}

// ErrDied means a sandbox's runner went away during a request: the sandbox
// died or was killed. See [DiedError].
var ErrDied = errors.New("sandbox died during the run")

// DiedError is what a request gets when its sandbox died under it. It
// matches [ErrDied], and [sandbox.ErrUnavailable] when the engine could
// not be asked why.
type DiedError struct {
	// OOMKilled: the engine killed the sandbox for passing its memory
	// limit.
	OOMKilled bool
	// ExitCode is the container's, if the engine said.
	ExitCode int
	// Err is [wire.ErrRunnerGone], or the engine's error.
	Err error
}

func (e *DiedError) Error() string {
	if e.OOMKilled {
		return "sandbox died during the run: killed for passing its memory limit"
	}
	return fmt.Sprintf("sandbox died during the run: %v", e.Err)
}

func (e *DiedError) Unwrap() []error { return []error{ErrDied, e.Err} }

// died asks the engine why sb's runner went away during a request (err,
// wrapping wire.ErrRunnerGone), marks sb to be destroyed when it is given
// back, and returns a *DiedError.
func (p *Pool) died(ctx context.Context, sb *Sandbox, err error) error {
	sb.died = true
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	st, serr := sb.c.Wait(sctx)
	cancel()
	switch {
	case serr != nil:
		p.NoteError(serr)
		return &DiedError{Err: fmt.Errorf("sandbox %s lost: %w", sandbox.ShortID(sb.ID()), serr)}
	case st.OOMKilled:
		return &DiedError{OOMKilled: true, ExitCode: st.ExitCode, Err: err}
	}
	if ctx.Err() == nil {
		p.log.Warn("sandbox died during a run", "sandbox_id", sandbox.ShortID(sb.ID()), "error", err, "exit_code", st.ExitCode)
	}
	p.checkEngine()
	return &DiedError{ExitCode: st.ExitCode, Err: err}
}

// WriteFile writes a file into the sandbox's workspace.
func (s *Sandbox) WriteFile(ctx context.Context, f *runnerv1.File) error {
	return s.rc.WriteFile(ctx, f)
}

// Reset scrubs the sandbox for an unrelated run; see [wire.Client.Reset].
// The pool does this itself between stateless runs.
func (s *Sandbox) Reset(ctx context.Context) error { return s.rc.Reset(ctx) }

// ReadFile reads a file of the sandbox's workspace.
func (s *Sandbox) ReadFile(ctx context.Context, path string, max uint64) (*runnerv1.File, error) {
	return s.rc.ReadFile(ctx, path, max)
}

// List lists a directory of the sandbox's workspace.
func (s *Sandbox) List(ctx context.Context, path string) (*runnerv1.FileList, error) {
	return s.rc.List(ctx, path)
}

// open starts a sandbox with the given memory limit and waits for its
// runner; a warm start (nobody waits for it) yields the CPU to runs until
// then (see weight.go). The start stays counted in its CPU set until the
// caller, holding p.mu, adds the sandbox to p.live or destroys it: it then
// calls doneOpeningLocked(sb.lane). Another start in between must count it.
func (p *Pool) open(ctx context.Context, memory int64, warm bool) (_ *Sandbox, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	spec := p.cfg.Spec
	spec.MemoryBytes = memory
	p.mu.Lock()
	probed := p.versions != nil && p.versionsImage == p.image
	image := p.image
	lane := p.laneLocked()
	p.mu.Unlock()
	defer func() {
		if err != nil {
			p.mu.Lock()
			p.doneOpeningLocked(lane)
			p.mu.Unlock()
		}
	}()
	if lane >= 0 {
		spec.CPUSet = p.cfg.CPUSets[lane]
	}
	if warm {
		spec.CPUShares = startShares
	}
	if probed {
		// Every sandbox has the same image: one runner's answer serves
		// them all, and the others start without the probes (a process
		// per language).
		spec.Command = append(slices.Clip(spec.Command), "-versions=false")
	}
	if p.cfg.NamesPreloaded != nil && !p.demand.wanted(p.cfg.MaxReuse) {
		spec.Command = append(slices.Clip(spec.Command), "-preload-start=false")
	}
	var id atomic.Value
	id.Store("")
	log := p.log
	spec.Stderr = func(line []byte) {
		log.Debug("runner", "sandbox_id", id.Load(), "line", string(line))
	}
	t0 := time.Now()
	c, err := p.cfg.Driver.Start(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("start sandbox: %w", err)
	}
	id.Store(sandbox.ShortID(c.ID()))
	if warm {
		stop := p.lowered(c)
		defer func() {
			stop()
			if err != nil {
				p.forget(c)
			} else {
				p.raise(c)
			}
		}()
	}
	sb := &Sandbox{c: c, rc: wire.NewClient(c.Stdout(), c.Stdin()), memory: memory, created: time.Now(), image: c.Image(), lane: lane, retireAt: p.drawRetireAt(), p: p}
	if sb.image != image {
		// The first sandbox, or the name names another image by now.
		p.checkImage(ctx)
	}
	sb.ready, err = sb.rc.Ready(ctx)
	if err != nil {
		p.destroyNow(sb)
		return nil, fmt.Errorf("wait for runner of sandbox %s: %w", sandbox.ShortID(c.ID()), err)
	}
	p.log.Debug("sandbox started", "sandbox_id", sandbox.ShortID(c.ID()), "took", time.Since(t0).Round(time.Millisecond))
	return sb, nil
}

// destroyNow closes sb's client and removes its container, waiting for the
// removal.
func (p *Pool) destroyNow(sb *Sandbox) {
	sb.rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sb.c.Remove(ctx); err != nil {
		p.log.Warn("remove sandbox", "sandbox_id", sandbox.ShortID(sb.ID()), "error", err)
		p.NoteError(err)
	}
}
