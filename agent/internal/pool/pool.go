// Package pool keeps an agent's sandboxes: a warm pool of started sandboxes
// whose runners are ready, refilled in the background, from which stateless
// runs take one and to which it returns scrubbed (or is destroyed); and the
// sessions, each of which holds one sandbox until it is closed or idles out.
//
// The pool watches the container engine: while it cannot be reached, the
// pool answers with errors wrapping [sandbox.ErrUnavailable]; when it is
// back, the pool removes what it lost track of and fills itself again.
//
// A Pool and its Sessions are safe for concurrent use. Close stops them and
// removes every sandbox.
package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/codemode-go/codemode/agent/internal/cpuslots"
	"github.com/codemode-go/codemode/agent/internal/languages"
	"github.com/codemode-go/codemode/agent/internal/sandbox"
	"github.com/codemode-go/codemode/agent/internal/wire"
	"github.com/codemode-go/codemode/internal/telemetry"
)

// ErrExhausted means every sandbox the agent may hold is in use (or every
// session slot is taken) and none came free in time.
var ErrExhausted = errors.New("no free sandbox")

// ErrClosed is returned after Close.
var ErrClosed = errors.New("pool closed")

// Config configures a Pool. Zero durations take the defaults below.
type Config struct {
	// Driver starts and removes containers.
	Driver sandbox.Driver
	// Spec is the sandbox every warm sandbox is made from. Its MemoryBytes is
	// the default memory limit; runs asking for another limit get a
	// dedicated sandbox.
	Spec sandbox.Spec
	// MinWarm sandboxes are kept started and ready (warm, or being
	// scrubbed) beside those at work; while runs wait for the CPUs (Gate),
	// only MinWarm in all (see spareQuiet).
	MinWarm int
	// Max bounds the sandboxes held at once: warm, busy, starting,
	// recycling and held by sessions.
	Max int
	// MaxReuse bounds how many runs a sandbox serves (scrubbed between runs)
	// before it is destroyed; each retires somewhat earlier, at random, so
	// that sandboxes made together are not replaced together (wear.go).
	MaxReuse int
	// StartTimeout bounds creating a sandbox until its runner is ready.
	StartTimeout time.Duration
	// ResetTimeout bounds the scrub between two runs.
	ResetTimeout time.Duration
	// WarmIdle is how long a warm sandbox beyond MinWarm may stay unused
	// before it is destroyed (a burst leaves many warm sandboxes behind).
	WarmIdle time.Duration
	// OnReady, if set, is called (from a goroutine of the pool, without its
	// lock held) whenever the engine goes away or comes back.
	OnReady func(ready bool)
	// Labels select the containers that are this pool's (LabelAgent=name):
	// leftovers carrying them are removed when the engine is first reached.
	Labels map[string]string
	Logger *slog.Logger
	// Metrics, if set, count sandboxes' and sessions' lifecycles.
	Metrics *Metrics
	// Gate, if set, is the agent's admission to the CPUs: a scrub takes a
	// slot of it (without waiting) for as long as it works, so that runs
	// are admitted beside scrubs only while CPUs are free; and the pool
	// grows past MinWarm sandboxes in all only while no run has waited
	// for a slot lately (spareQuiet).
	Gate *cpuslots.Gate
	// CPUSets, if set, are the host CPUs sandboxes are pinned to (see
	// sandbox.Spec.CPUSet), each sandbox to one set: the pool spreads them
	// evenly, and a run takes a warm sandbox on the set with the least
	// work under way. Empty: none is pinned.
	CPUSets []string
	// NamesPreloaded, if set, says whether a stateless run of language
	// with code would use the sandboxes' preloaded parent (see
	// preloadDemand); nil: the runners preload nothing.
	NamesPreloaded func(language, code string) bool

	// yieldFor bounds a warm start's low CPU weight (see weight.go);
	// defaultYieldFor, or shorter in tests.
	yieldFor time.Duration
	// measureSet measures a CPU set's speed (see cpusets.go);
	// measureSpeed, or another in tests.
	measureSet func(set string) (time.Duration, error)
}

// Defaults.
const (
	// DefaultStartTimeout leaves room for gVisor's boot and a preloaded
	// parent's imports, which the runner does before it says it is ready:
	// 6-13 s together on a 2-CPU host beside one client's runs, and the
	// imports alone have a bound of 20 s (parentReadyTimeout in the
	// runner's package preload). A start given up is work thrown away
	// that the pool then begins again, so this bound is for a sandbox that
	// will not get ready at all, not for a slow one on a busy host.
	DefaultStartTimeout = 60 * time.Second
	// DefaultResetTimeout leaves room for the runner to start a preloaded
	// parent on a loaded host (its own bound, parentReadyTimeout in the
	// runner's package preload) after the scrub itself (tens of
	// milliseconds).
	DefaultResetTimeout = 30 * time.Second
	DefaultWarmIdle     = 5 * time.Minute
	// maxStarting bounds the warm sandboxes started at once: starting one
	// is CPU-heavy under runsc.
	maxStarting = 2
	// startFailuresWarmed warm starts failing in a row make the pool
	// warmed (see Stats.Warmed) without its warm sandboxes: the failure
	// is not a passing one.
	startFailuresWarmed = 3
)

// Validate reports the first problem with c.
func (c *Config) Validate() error {
	switch {
	case c.Driver == nil:
		return errors.New("pool: no driver")
	case c.Max < 1:
		return errors.New("pool: max sandboxes must be at least 1")
	case c.MinWarm < 0 || c.MinWarm > c.Max:
		return fmt.Errorf("pool: min warm %d must be between 0 and max %d", c.MinWarm, c.Max)
	case c.MaxReuse < 1:
		return errors.New("pool: max reuse must be at least 1")
	case len(c.Labels) == 0:
		return errors.New("pool: no labels to recognize its containers by")
	case slices.Contains(c.CPUSets, ""):
		return errors.New("pool: an empty CPU set")
	}
	return c.Spec.Validate()
}

// Pool is a warm pool of sandboxes.
type Pool struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	warm     []*Sandbox          // idle and ready; taken from the end
	n        [numStates]int      // sandboxes per state, warm ones excepted (see state)
	live     map[string]*Sandbox // every sandbox the pool made and not yet destroyed
	waiting  int                 // callers waiting for a default sandbox
	ready    bool                // the engine answers
	warmed   bool                // see Stats.Warmed
	closed   bool
	versions map[string]string
	// versionsImage is the image versions were reported in; image the one
	// Spec.Image named when last checked (see checkImage), "" before.
	versionsImage, image string
	preloadMissing       []string        // see Stats.PreloadMissing
	opening              []int           // sandboxes being started, per CPU set
	speed                []time.Duration // each CPU set's last measure (see cpusets.go), 0 before
	measuredAt           []time.Time     // when each was taken
	laneIdle             chan struct{}   // a sandbox is back from its run (see speedLoop); nil if nothing is pinned
	lastTake             time.Time       // when a run last asked for a warm sandbox
	changed              chan struct{}   // closed and replaced on every change
	nextFill             time.Time       // no warm start before this (back-off after failures)
	failures             int
	demand               preloadDemand
	low                  map[sandbox.Container]struct{} // warm starts at startShares (see weight.go)

	kick  chan struct{}
	check chan struct{}
	stop  context.CancelFunc
	wg    sync.WaitGroup
}

// setVersionsLocked records the interpreter versions sb's runner reported,
// and the modules to preload that the image lacks. The first time for an
// image, it says which interpreters the image has, and warns about those it
// lacks (runs in those languages would fail) and about the modules (runs
// import them themselves). p.mu is held.
func (p *Pool) setVersionsLocked(sb *Sandbox) {
	v := sb.Versions()
	if len(v) == 0 {
		return // a runner told not to probe, or whose probes all failed
	}
	missing := sb.ready.GetPreloadMissing()
	if p.versions == nil || p.versionsImage != sb.image {
		var lacks []string
		for _, l := range languages.All() {
			if l.Version != nil && v[l.Name] == "" {
				lacks = append(lacks, fmt.Sprintf("%s (%s)", l.Name, l.Program()))
			}
		}
		if len(lacks) > 0 {
			p.log.Warn("the sandbox image lacks interpreters: runs in their languages fail", "image", p.cfg.Spec.Image, "missing", lacks)
		} else {
			p.log.Info("sandbox image ready", "image", p.cfg.Spec.Image, "versions", v)
		}
		if len(missing) > 0 {
			p.log.Warn("the sandbox image lacks modules to preload: runs that import them import them themselves", "image", p.cfg.Spec.Image, "missing", missing)
		}
	}
	p.versions, p.versionsImage, p.preloadMissing = v, sb.image, missing
}

// New returns a pool; Start starts it.
func New(cfg Config) (*Pool, error) {
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.ResetTimeout == 0 {
		cfg.ResetTimeout = DefaultResetTimeout
	}
	if cfg.WarmIdle == 0 {
		cfg.WarmIdle = DefaultWarmIdle
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.yieldFor == 0 {
		cfg.yieldFor = defaultYieldFor
	}
	if cfg.measureSet == nil {
		cfg.measureSet = measureSpeed
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Labels = maps.Clone(cfg.Labels)
	cfg.Spec.Labels = maps.Clone(cfg.Labels)
	var laneIdle chan struct{}
	if len(cfg.CPUSets) > 0 {
		laneIdle = make(chan struct{}, 1)
	}
	return &Pool{
		laneIdle:   laneIdle,
		cfg:        cfg,
		log:        cfg.Logger,
		live:       map[string]*Sandbox{},
		low:        map[sandbox.Container]struct{}{},
		opening:    make([]int, len(cfg.CPUSets)),
		speed:      make([]time.Duration, len(cfg.CPUSets)),
		measuredAt: make([]time.Time, len(cfg.CPUSets)),
		changed:    make(chan struct{}),
		kick:       make(chan struct{}, 1),
		check:      make(chan struct{}, 1),
	}, nil
}

// Start reaches the engine, removes leftover sandboxes of this pool's labels,
// and starts filling the pool in the background. If the engine cannot be
// reached, Start still succeeds: the pool reports itself unavailable and
// keeps trying.
func (p *Pool) Start(ctx context.Context) {
	ctx, p.stop = context.WithCancel(context.WithoutCancel(ctx))
	p.reconnect(ctx)
	p.wg.Add(2)
	go p.fillLoop(ctx)
	go p.watchLoop(ctx)
	if len(p.cfg.CPUSets) > 0 {
		p.wg.Add(1)
		go p.speedLoop(ctx)
	}
}

// Close stops the pool and removes every sandbox it holds, including those
// taken by runs and sessions, then any container left with its labels.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	all := make([]*Sandbox, 0, len(p.live))
	for _, sb := range p.live {
		all = append(all, sb)
		p.cfg.Metrics.destroy(destroyPoolClosed)
	}
	p.live = map[string]*Sandbox{}
	p.warm = nil
	p.broadcastLocked()
	p.mu.Unlock()
	if p.stop != nil {
		p.stop()
	}
	var wg sync.WaitGroup
	for _, sb := range all {
		wg.Go(func() { p.destroyNow(sb) })
	}
	wg.Wait()
	p.wg.Wait()
	_, err := p.cfg.Driver.RemoveAll(ctx, p.cfg.Labels, nil)
	if err != nil {
		return fmt.Errorf("remove sandboxes: %w", err)
	}
	return nil
}

// Stats is a snapshot of the pool.
type Stats struct {
	Warm, Busy, Held, Starting, Recycling, Max int
	// Ready: the engine answers.
	Ready bool
	// Warmed: since the engine was last reached, the pool has had its
	// MinWarm warm sandboxes, or has failed to start one three times in
	// a row. Until then a run may wait for a sandbox to start.
	Warmed bool
	// Versions are the interpreter versions the runners report.
	Versions map[string]string
	// PreloadMissing are the modules to preload that the image lacks, as
	// the runner that reported Versions found.
	PreloadMissing []string
}

// Stats returns a snapshot of the pool.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{
		Warm: len(p.warm), Busy: p.n[busy], Held: p.n[held],
		Starting: p.n[starting] + p.n[direct], Recycling: p.n[recycling], Max: p.cfg.Max,
		Ready: p.ready && !p.closed, Warmed: p.warmed, Versions: p.versions, PreloadMissing: p.preloadMissing,
	}
}

// DefaultMemory is the memory limit of warm sandboxes.
func (p *Pool) DefaultMemory() int64 { return p.cfg.Spec.MemoryBytes }

// Acquire takes a sandbox for one stateless run: a warm one if there is
// one; otherwise one being started or scrubbed, if it is not promised to
// an earlier caller; otherwise a new one if the pool is below its maximum;
// otherwise it waits. A memory limit other than the warm sandboxes' (0
// means theirs) always gets a new sandbox of its own, destroyed after the
// run.
// Give the sandbox back with Release.
//
// # Errors
//
// An error wrapping [sandbox.ErrUnavailable] while the engine is away;
// [ErrExhausted] (wrapped, with ctx's error) if ctx ends while waiting;
// [ErrClosed].
func (p *Pool) Acquire(ctx context.Context, memory int64) (*Sandbox, error) {
	return p.AcquireFor(ctx, memory, "", "")
}

// AcquireFor is Acquire for a stateless run of code in language: among the
// warm sandboxes it takes the most recently used one whose runner has the
// interpreter the run wants prestarted, if any (see [Sandbox.Prestarted]):
// of that language, and forked from its preloaded parent when the code
// names a preloaded module (Config.NamesPreloaded), fresh when not; so
// that the run does not wait for one to start.
func (p *Pool) AcquireFor(ctx context.Context, memory int64, language, code string) (*Sandbox, error) {
	want := wire.Prestart{Language: language}
	if language != "" && p.cfg.NamesPreloaded != nil {
		want.Forked = p.cfg.NamesPreloaded(language, code)
	}
	if memory == 0 {
		memory = p.cfg.Spec.MemoryBytes
	}
	dflt := memory == p.cfg.Spec.MemoryBytes
	p.mu.Lock()
	defer p.mu.Unlock()
	inLine := false // whether this caller is counted in p.waiting
	defer func() {
		if inLine {
			p.waiting--
		}
	}()
	for {
		switch {
		case p.closed:
			return nil, ErrClosed
		case !p.ready:
			return nil, fmt.Errorf("take a sandbox: %w", sandbox.ErrUnavailable)
		}
		if dflt {
			if sb := p.takeWarmLocked(want); sb != nil {
				return sb, nil
			}
			if !inLine {
				inLine = true
				p.waiting++
			}
			p.raiseForWaitersLocked()
		}
		// Start one for this caller if it is past the sandboxes on their
		// way to the warm list (each promised to an earlier caller), or
		// needs a memory limit of its own, and the pool has room. Starts
		// are CPU-heavy: under a burst at most maxStarting go at once,
		// and the sandboxes scrubbed meanwhile serve the line, so that
		// the pool grows with the load rather than thrashing.
		if (!dflt || p.waiting > p.incomingLocked()) && p.totalLocked() < p.cfg.Max && p.n[direct] < maxStarting {
			if inLine {
				inLine = false
				p.waiting--
			}
			return p.startDirectLocked(ctx, memory, !dflt)
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
			p.mu.Lock()
		case <-ctx.Done():
			p.mu.Lock()
			return nil, fmt.Errorf("%w: all %d sandboxes in use: %w", ErrExhausted, p.cfg.Max, ctx.Err())
		}
	}
}

// takeWarmLocked takes a warm sandbox for a run that wants want
// prestarted (see AcquireFor), replacing any it finds dead; nil if there is
// none. p.mu is held.
func (p *Pool) takeWarmLocked(want wire.Prestart) *Sandbox {
	p.lastTake = time.Now()
	for len(p.warm) > 0 {
		i := p.pickWarmLocked(want)
		sb := p.warm[i]
		p.warm = slices.Delete(p.warm, i, i+1)
		if sb.dead() {
			// It died while it waited (killed from outside, or the
			// engine went away): replace it.
			p.log.Warn("warm sandbox died", "sandbox_id", sandbox.ShortID(sb.ID()))
			p.endLocked(warm)
			p.destroyLocked(sb, destroyDied)
			p.checkEngine()
			continue
		}
		p.moveLocked(warm, busy)
		p.kickFill()
		if sb.uses > 0 {
			p.cfg.Metrics.took(takeReused)
		} else {
			p.cfg.Metrics.took(takeWarm)
		}
		return sb
	}
	return nil
}

// startDirectLocked starts a sandbox for the caller, who waits for it, and
// returns it busy; dedicated ones (a memory limit of their own) are
// destroyed after their run. p.mu is held, and released during the start.
func (p *Pool) startDirectLocked(ctx context.Context, memory int64, dedicated bool) (*Sandbox, error) {
	p.enterLocked(direct)
	p.mu.Unlock()
	t0 := time.Now()
	sb, err := p.open(ctx, memory, false)
	p.cfg.Metrics.started(false, time.Since(t0), err)
	p.mu.Lock()
	if err != nil {
		p.endLocked(direct)
		p.NoteError(err)
		return nil, err
	}
	p.doneOpeningLocked(sb.lane)
	if p.closed {
		p.endLocked(direct)
		p.cfg.Metrics.destroy(destroyPoolClosed)
		p.mu.Unlock()
		p.destroyNow(sb)
		p.mu.Lock()
		return nil, ErrClosed
	}
	sb.dedicated = dedicated
	p.live[sb.ID()] = sb
	p.setVersionsLocked(sb)
	p.moveLocked(direct, busy)
	p.cfg.Metrics.took(takeCold)
	return sb, nil
}

// Release gives back a sandbox taken with Acquire. If reusable (the run
// ended normally), it did not die, and it has served fewer than MaxReuse
// runs, it is scrubbed in the background and returned to the warm list;
// otherwise it is destroyed. ctx is the run's: the scrub's span (see
// telemetry.StartSpan) is a child of the span it carries; its cancellation
// is not the scrub's.
func (p *Pool) Release(ctx context.Context, sb *Sandbox, reusable bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if reason := p.unfitLocked(sb, reusable); reason != "" {
		p.endLocked(busy)
		p.destroyLocked(sb, reason)
		return
	}
	p.moveLocked(busy, recycling)
	_, span := telemetry.StartSpan(ctx, "scrub")
	// Taken before the run's own slot is given back, so that no run is
	// admitted in between.
	slot := p.cfg.Gate.Take()
	p.wg.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.ResetTimeout)
		t0 := time.Now()
		err := sb.Reset(ctx)
		slot.Leave()
		p.cfg.Metrics.scrubbed(time.Since(t0), err)
		cancel()
		telemetry.EndSpan(span, err)
		p.mu.Lock()
		defer p.mu.Unlock()
		switch {
		case err != nil:
			p.log.Warn("scrub sandbox; destroying it", "sandbox_id", sandbox.ShortID(sb.ID()), "error", err)
			p.endLocked(recycling)
			p.destroyLocked(sb, destroyScrubFailed)
		case p.closed || !p.ready:
			p.endLocked(recycling)
			p.destroyLocked(sb, destroyEngineAway)
		case p.staleLocked(sb):
			p.endLocked(recycling)
			p.destroyLocked(sb, destroyImageChanged)
		default:
			sb.idleSince = time.Now()
			p.warm = append(p.warm, sb)
			p.moveLocked(recycling, warm)
			p.noteWarmLocked()
			p.noteLaneIdleLocked()
		}
	})
}

// unfitLocked returns why sb, given back after a run, is not to serve
// another, or "" if it is. p.mu is held.
func (p *Pool) unfitLocked(sb *Sandbox, reusable bool) string {
	switch {
	case p.closed:
		return destroyPoolClosed
	case !p.ready:
		return destroyEngineAway
	case sb.died:
		return destroyDied
	case sb.dedicated:
		return destroyDedicated
	case !reusable:
		return destroyNotReusable
	case sb.uses >= sb.retireAt:
		return destroyMaxReuse
	case p.staleLocked(sb):
		return destroyImageChanged
	}
	return ""
}

// Hold takes a sandbox for a session, as Acquire does. Give it back with
// Drop, which destroys it.
func (p *Pool) Hold(ctx context.Context, memory int64) (*Sandbox, error) {
	p.demand.noteSession()
	sb, err := p.Acquire(ctx, memory)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.moveLocked(busy, held)
	sb.held = true
	p.mu.Unlock()
	return sb, nil
}

// Drop destroys a sandbox taken with Hold.
func (p *Pool) Drop(sb *Sandbox) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endLocked(held)
	p.destroyLocked(sb, destroySessionEnded)
}

// destroyLocked forgets sb, which has left its state (endLocked), and
// removes its container in the background; reason is why, for Metrics.
func (p *Pool) destroyLocked(sb *Sandbox, reason string) {
	if p.closed {
		// Close removed (and counted) every container already.
		sb.rc.Close()
		return
	}
	p.cfg.Metrics.destroy(reason)
	delete(p.live, sb.ID())
	p.kickFill()
	p.wg.Go(func() { p.destroyNow(sb) })
}

// noteWarmLocked records that the pool has warmed once it has MinWarm warm
// sandboxes. p.mu is held.
func (p *Pool) noteWarmLocked() {
	if len(p.warm) >= p.cfg.MinWarm {
		p.warmed = true
	}
}

func (p *Pool) broadcastLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Pool) kickFill() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// NoteError tells the pool about an error met while using one of its
// sandboxes: if it says the engine may be away, the pool checks the engine
// at once.
func (p *Pool) NoteError(err error) {
	if errors.Is(err, sandbox.ErrUnavailable) {
		p.checkEngine()
	}
}

// checkEngine makes the watcher check the engine at once.
func (p *Pool) checkEngine() {
	select {
	case p.check <- struct{}{}:
	default:
	}
}

// spareQuiet is how long no run may have waited for a CPU slot
// (Config.Gate) before the pool starts sandboxes past MinWarm in all.
//
// The pool keeps MinWarm sandboxes idle beside those at work, so that a
// caller finds one ready rather than waiting for a scrub; under a steady
// load that means MinWarm more than the load keeps busy. Where runs wait
// for the CPUs, such a sandbox only waits too: a caller that takes it
// waits for a slot instead of a scrub, and the scrubs are what the slots
// serve anyway. Each costs a start, seconds of CPU (a preloaded parent's
// imports: ~4 s under gVisor) taken from the runs, and its memory. On a
// 2-CPU host, four callers of the numpy item against an agent with
// --min-active 4 grew its pool from 5 to 7 sandboxes, and two such starts
// in a row of 12 runs cut its runs/s from 6.2-6.6 to 4.0 (the runner's
// RATIONALE, "Three make bench runs of one build"). While runs wait, the
// pool keeps MinWarm in all, and callers beyond them wait for a scrub or
// start their own (Acquire): it grows with the callers, not ahead of them.
const spareQuiet = 10 * time.Second

// spareRoomLocked reports whether fill may start another warm sandbox:
// the pool has fewer than MinWarm in all for stateless runs, or no run
// has waited for a CPU slot within spareQuiet. p.mu is held.
func (p *Pool) spareRoomLocked() bool {
	stateless := p.totalLocked() - p.n[held]
	return stateless < p.cfg.MinWarm || !p.cfg.Gate.WaitedWithin(spareQuiet)
}

// fillLoop keeps MinWarm sandboxes warm.
func (p *Pool) fillLoop(ctx context.Context) {
	defer p.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		p.fill(ctx)
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-tick.C:
		}
	}
}

func (p *Pool) fill(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Warm sandboxes are taken from the end, so the front ones have waited
	// longest.
	for len(p.warm) > p.cfg.MinWarm && time.Since(p.warm[0].idleSince) > p.cfg.WarmIdle {
		sb := p.warm[0]
		p.warm = p.warm[1:]
		p.endLocked(warm)
		p.destroyLocked(sb, destroyIdle)
	}
	for p.ready && !p.closed &&
		len(p.warm)+p.incomingLocked() < p.cfg.MinWarm && p.spareRoomLocked() &&
		p.totalLocked() < p.cfg.Max &&
		p.n[starting] < maxStarting &&
		!time.Now().Before(p.nextFill) {
		p.enterLocked(starting)
		p.wg.Go(func() {
			t0 := time.Now()
			sb, err := p.open(ctx, p.cfg.Spec.MemoryBytes, true)
			p.cfg.Metrics.started(true, time.Since(t0), err)
			p.mu.Lock()
			defer p.mu.Unlock()
			if err != nil {
				p.endLocked(starting)
				p.failures++
				if p.failures >= startFailuresWarmed {
					// Runs will meet the same error: waiting for
					// warm sandboxes would hide it.
					p.warmed = true
				}
				backoff := min(time.Duration(1<<min(p.failures, 5))*250*time.Millisecond, 10*time.Second)
				p.nextFill = time.Now().Add(backoff)
				if ctx.Err() == nil {
					p.log.Warn("start warm sandbox", "error", err, "retry_in", backoff)
				}
				p.NoteError(err)
				return
			}
			p.doneOpeningLocked(sb.lane)
			p.failures = 0
			p.setVersionsLocked(sb)
			if p.closed || !p.ready {
				reason := destroyEngineAway
				if p.closed {
					reason = destroyPoolClosed
				}
				p.endLocked(starting)
				p.cfg.Metrics.destroy(reason)
				p.wg.Go(func() { p.destroyNow(sb) })
				return
			}
			p.live[sb.ID()] = sb
			sb.idleSince = time.Now()
			p.warm = append(p.warm, sb)
			p.moveLocked(starting, warm)
			p.noteWarmLocked()
			p.kickFill()
		})
	}
}

// watchLoop checks the engine: every few seconds while it answers, often
// while it does not.
func (p *Pool) watchLoop(ctx context.Context) {
	defer p.wg.Done()
	for {
		p.mu.Lock()
		interval := 5 * time.Second
		if !p.ready {
			interval = 500 * time.Millisecond
		}
		p.mu.Unlock()
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-p.check:
		case <-t.C:
		}
		t.Stop()
		p.reconnect(ctx)
		p.mu.Lock()
		ready := p.ready
		p.mu.Unlock()
		if ready {
			p.checkImage(ctx)
		}
	}
}

// reconnect pings the engine and moves the pool between ready and
// unavailable.
func (p *Pool) reconnect(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	err := p.cfg.Driver.Ping(pctx)
	cancel()
	p.mu.Lock()
	wasReady := p.ready
	p.mu.Unlock()
	switch {
	case err != nil && wasReady:
		p.log.Warn("container engine unavailable; answering unavailable until it is back", "error", err)
		p.mu.Lock()
		p.ready, p.warmed = false, false
		warm := p.warm
		p.warm = nil
		for _, sb := range warm {
			delete(p.live, sb.ID())
			p.cfg.Metrics.destroy(destroyEngineAway)
		}
		p.broadcastLocked()
		p.mu.Unlock()
		for _, sb := range warm {
			sb.rc.Close()
		}
		if p.cfg.OnReady != nil {
			p.cfg.OnReady(false)
		}
	case err == nil && !wasReady:
		// Remove what was left behind: containers of an earlier agent of
		// this name, or of this one while the engine was away.
		p.mu.Lock()
		keep := make(map[string]bool, len(p.live))
		for id := range p.live {
			keep[id] = true
		}
		p.mu.Unlock()
		rctx, cancel := context.WithTimeout(ctx, time.Minute)
		n, err := p.cfg.Driver.RemoveAll(rctx, p.cfg.Labels, keep)
		cancel()
		if err != nil {
			p.log.Warn("remove leftover sandboxes", "error", err)
			return
		}
		if n > 0 {
			p.log.Info("removed leftover sandboxes", "count", n)
		}
		p.mu.Lock()
		p.ready, p.warmed = true, p.cfg.MinWarm == 0
		p.failures = 0
		p.nextFill = time.Time{}
		p.broadcastLocked()
		p.mu.Unlock()
		p.log.Info("container engine ready")
		p.kickFill()
		if p.cfg.OnReady != nil {
			p.cfg.OnReady(true)
		}
	}
}
