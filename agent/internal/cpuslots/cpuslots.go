// Package cpuslots admits the agent's work to the host's CPUs at the rate they
// can serve it.
//
// Under gVisor every sandbox that works at once adds its own kernel, stub
// processes and memory to what the host's CPUs switch between. On a 2-CPU
// host, stateless Python at concurrency 4 took about 160 ms of host CPU per
// run when at most two sandboxes worked at once, and about 290 ms when the
// pool let a dozen work at once: the same runs, at little more than half the
// rate (see the agent's RATIONALE.md, "Admission at the CPUs' rate"). A
// [Gate] keeps the sandboxes working at once (running the start of a program,
// or being scrubbed) to a number of slots, about the host's CPUs, and queues
// the rest in arrival order.
//
// A slot is a claim on a CPU, not on a sandbox: a program that sleeps or
// waits on the network holds its slot for at most the gate's hold time, after
// which it runs on without one, so that waiting programs do not hold back
// the runs queued behind them for long.
package cpuslots

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// ErrSaturated means that the context ended while the caller waited for a
// slot: the host's CPUs were taken for longer than the caller would wait.
var ErrSaturated = errors.New("the agent's CPUs are saturated")

// DefaultHold is how long a run keeps its slot at most. A short program
// (most runs of an AI agent print a result within tens of milliseconds)
// ends well within it, and its slot passes to the scrub of its sandbox; a
// long one, or one that waits, lets the next run in after it.
const DefaultHold = 250 * time.Millisecond

// A Gate admits at most Slots tickets at once. The zero value and a nil
// *Gate admit everyone at once. Its methods may be called concurrently.
type Gate struct {
	slots int
	hold  time.Duration

	mu       sync.Mutex
	used     int
	waiting  []*waiter // in arrival order
	lastWait time.Time // when a caller of Enter last found no slot free
}

type waiter struct {
	ready chan struct{} // closed once admitted
	t     *Ticket
}

// New returns a gate of slots slots whose tickets hold them for at most hold
// (at least 1 ms). slots < 1 means no limit.
func New(slots int, hold time.Duration) *Gate {
	return &Gate{slots: slots, hold: max(hold, time.Millisecond)}
}

// Slots is the gate's number of slots, 0 for no limit.
func (g *Gate) Slots() int {
	if g.unbounded() {
		return 0
	}
	return g.slots
}

func (g *Gate) unbounded() bool { return g == nil || g.slots < 1 }

// Stats are how many tickets hold a slot and how many callers wait.
type Stats struct {
	Admitted, Waiting int
}

// Stats returns the gate's state now.
func (g *Gate) Stats() Stats {
	if g == nil {
		return Stats{}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return Stats{Admitted: g.used, Waiting: len(g.waiting)}
}

// WaitedWithin reports whether a caller of Enter found no slot free within
// the last d: the host's CPUs were all at work. It is false for a gate
// without a limit.
func (g *Gate) WaitedWithin(d time.Duration) bool {
	if g.unbounded() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.lastWait.IsZero() && time.Since(g.lastWait) < d
}

// Enter waits until a slot is free and no earlier caller is still waiting,
// and takes it. If ctx ends first it returns ErrSaturated, wrapped with the
// context's error.
func (g *Gate) Enter(ctx context.Context) (*Ticket, error) {
	if g.unbounded() {
		return nil, nil
	}
	g.mu.Lock()
	if g.used < g.slots && len(g.waiting) == 0 {
		t := g.admitLocked(g.hold)
		g.mu.Unlock()
		return t, nil
	}
	w := &waiter{ready: make(chan struct{})}
	g.waiting = append(g.waiting, w)
	g.lastWait = time.Now()
	g.mu.Unlock()
	select {
	case <-w.ready:
		return w.t, nil
	case <-ctx.Done():
	}
	g.mu.Lock()
	select {
	case <-w.ready:
		// Admitted as ctx ended: pass the slot on.
		g.mu.Unlock()
		w.t.Leave()
	default:
		if i := slices.Index(g.waiting, w); i >= 0 {
			g.waiting = slices.Delete(g.waiting, i, i+1)
		}
		g.mu.Unlock()
	}
	return nil, fmt.Errorf("%w (%d runs at once): %w", ErrSaturated, g.slots, context.Cause(ctx))
}

// Take takes a slot without waiting, beyond the limit if need be, until
// Leave, without the hold time. It is for work that others wait on and that
// uses the CPUs throughout, such as the scrub that makes a sandbox ready for
// the next run: it counts against the runs admitted after it, but is never
// queued behind them.
func (g *Gate) Take() *Ticket {
	if g.unbounded() {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.admitLocked(0)
}

// admitLocked counts a slot taken and returns its ticket, which frees it
// after hold at the latest (0: only on Leave). g.mu is held.
func (g *Gate) admitLocked(hold time.Duration) *Ticket {
	g.used++
	t := &Ticket{g: g}
	if hold > 0 {
		t.timer = time.AfterFunc(hold, t.Leave)
	}
	return t
}

// A Ticket holds one slot of a Gate until Leave, or, if it was admitted by
// Enter, until the gate's hold time has passed. A nil *Ticket holds nothing.
type Ticket struct {
	g     *Gate
	timer *time.Timer
	once  sync.Once
}

// Leave frees the ticket's slot, admitting the caller who has waited
// longest. It may be called more than once, and after the hold time.
func (t *Ticket) Leave() {
	if t == nil {
		return
	}
	t.once.Do(func() {
		g := t.g
		g.mu.Lock()
		defer g.mu.Unlock()
		if t.timer != nil { // set under g.mu
			t.timer.Stop()
		}
		g.used--
		for g.used < g.slots && len(g.waiting) > 0 {
			w := g.waiting[0]
			g.waiting[0] = nil
			g.waiting = g.waiting[1:]
			w.t = g.admitLocked(g.hold)
			close(w.ready)
		}
	})
}
