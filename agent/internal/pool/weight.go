package pool

import (
	"context"
	"time"

	"github.com/codemode-go/codemode/agent/internal/sandbox"
)

// Warm sandboxes start at a low CPU weight, so that on a contended CPU the
// runs of the sandboxes at work go first. A start is seconds of CPU (a
// preloaded parent's imports: ~3 s under runsc), and a sandbox at work
// shares its pinned CPU with whatever else the pool put there: in two runsc
// containers pinned to one CPU, a loop of `python3 -c 'print(1)'` took p50
// 48 ms alone, 203 ms beside a loop of the default preload's imports at
// the same weight, 57 ms beside it at weight 128 and 64 ms at 256. A weight
// does not limit an uncontended CPU, so a start on an idle host is as fast
// as before.
//
// A start is lowered only while nobody needs it: it gets the default weight
// once its runner is ready (with a preloaded parent, after its imports;
// before it is warm), at once when more callers wait for a sandbox than
// are being scrubbed (one of them may get the start), and after
// Config.yieldFor at the latest, so
// that a host whose CPUs stay busy delays a start by that much and not past
// its timeouts. A start for a caller that waits for it (startDirectLocked)
// is never lowered.
const (
	// startShares is a warm start's CPU weight against the default.
	startShares = 128
	// defaultShares is Docker's default CPU weight.
	defaultShares = 1024
	// defaultYieldFor bounds how long a start keeps startShares: long
	// enough for gVisor's boot and a parent's imports (~5 s of CPU), which
	// a bound of 3 s raised halfway, and short enough that a start on a
	// CPU that stays busy still ends within DefaultStartTimeout.
	defaultYieldFor = 10 * time.Second
)

// lowered records c, started at startShares, until raise. If callers
// already need it (startsNeededLocked), it is raised at once. The returned
// stop ends the bound's timer.
func (p *Pool) lowered(c sandbox.Container) (stop func() bool) {
	p.mu.Lock()
	p.low[c] = struct{}{}
	needed := p.startsNeededLocked()
	p.mu.Unlock()
	if needed {
		go p.raise(c)
	}
	return time.AfterFunc(p.cfg.yieldFor, func() { p.raise(c) }).Stop
}

// raise gives c the default CPU weight, if it still has startShares.
func (p *Pool) raise(c sandbox.Container) {
	p.mu.Lock()
	_, ok := p.low[c]
	delete(p.low, c)
	p.mu.Unlock()
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.SetCPUShares(ctx, defaultShares); err != nil {
		select {
		case <-c.Done(): // removed meanwhile
		default:
			p.log.Warn("raise a started sandbox's CPU weight", "sandbox_id", sandbox.ShortID(c.ID()), "error", err)
		}
	}
}

// forget drops c from the lowered starts without changing its weight (it
// failed to start and is being removed).
func (p *Pool) forget(c sandbox.Container) {
	p.mu.Lock()
	delete(p.low, c)
	p.mu.Unlock()
}

// startsNeededLocked reports whether more callers wait than sandboxes are
// being scrubbed: one of them may get a start. While the scrubs under way
// can serve them all (each in tens to hundreds of milliseconds, against a
// start's seconds), the starts keep yielding. p.mu is held.
func (p *Pool) startsNeededLocked() bool { return p.waiting > p.n[recycling] }

// raiseForWaitersLocked raises every lowered start if startsNeededLocked.
// p.mu is held.
func (p *Pool) raiseForWaitersLocked() {
	if p.startsNeededLocked() {
		p.raiseAllLocked()
	}
}

// raiseAllLocked raises every lowered start. p.mu is held.
func (p *Pool) raiseAllLocked() {
	for c := range p.low {
		go p.raise(c)
	}
}
