package pool

import (
	"context"
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

	// uses counts the runs served; only the holder touches it.
	uses int
	// idleSince is when it last joined the warm list; guarded by the pool.
	idleSince time.Time
	// dedicated sandboxes (made for a non-default memory limit) are never
	// recycled.
	dedicated bool
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

// Prestarted is the language of the interpreter the runner keeps started
// for the sandbox's next stateless run; "" if none. See
// [wire.Client.Prestarted].
func (s *Sandbox) Prestarted() string { return s.rc.Prestarted() }

// Versions are the interpreter versions the runner reported when it started.
func (s *Sandbox) Versions() map[string]string { return s.ready.GetVersions() }

// Run runs one program in the sandbox, its egress decided by egress (nil:
// none); see [wire.Client.RunEgress].
func (s *Sandbox) Run(ctx context.Context, run *runnerv1.Run, out func(wire.Stream, []byte), egress wire.Egress) (*runnerv1.Exit, error) {
	s.uses++
	return s.rc.RunEgress(ctx, run, out, egress)
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

// State waits (bounded by ctx) for the container to stop and returns its
// state, to learn why a runner went away (for example, the sandbox passed
// its memory limit).
func (s *Sandbox) State(ctx context.Context) (sandbox.State, error) {
	return s.c.Wait(ctx)
}

// open starts a sandbox with the given memory limit and waits for its
// runner.
func (p *Pool) open(ctx context.Context, memory int64) (*Sandbox, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	spec := p.cfg.Spec
	spec.MemoryBytes = memory
	p.mu.Lock()
	probed := p.versions != nil
	p.mu.Unlock()
	if probed {
		// Every sandbox has the same image: one runner's answer serves
		// them all, and the others start without the probes (a process
		// per language).
		spec.Command = append(slices.Clip(spec.Command), "-versions=false")
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
	id.Store(shortID(c.ID()))
	sb := &Sandbox{c: c, rc: wire.NewClient(c.Stdout(), c.Stdin()), memory: memory, created: time.Now()}
	sb.ready, err = sb.rc.Ready(ctx)
	if err != nil {
		p.destroyNow(sb)
		return nil, fmt.Errorf("wait for runner of sandbox %s: %w", shortID(c.ID()), err)
	}
	p.log.Debug("sandbox started", "sandbox_id", shortID(c.ID()), "took", time.Since(t0).Round(time.Millisecond))
	return sb, nil
}

// destroyNow closes sb's client and removes its container, waiting for the
// removal.
func (p *Pool) destroyNow(sb *Sandbox) {
	sb.rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sb.c.Remove(ctx); err != nil {
		p.log.Warn("remove sandbox", "sandbox_id", shortID(sb.ID()), "error", err)
		p.noteErr(err)
	}
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
