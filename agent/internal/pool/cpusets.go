package pool

import (
	"context"
	"slices"
	"time"

	"github.com/codemode-go/codemode/agent/internal/wire"
	"github.com/codemode-go/codemode/internal/cpuset"
)

// Sandboxes pinned to CPU sets (Config.CPUSets; package internal/cpuset
// says why). The pool spreads sandboxes evenly over the sets, and a run takes
// a warm sandbox on the set with the least work under way, and among those
// on a set that is not slow.
//
// The CPUs of a virtual machine do not always deliver alike (cpuset.Speed
// says how and why): on the machines codemode is measured on, one of two
// CPUs is at times 1.3-2x as slow for whatever waits on memory, for
// seconds to minutes, then the other or neither. Pinned, a sandbox cannot
// move off such a CPU, so while runs come the pool measures what each set
// delivers, at most every speedEvery and when none of the set's sandboxes
// works, and calls a set slow while it takes more than slowerBy the
// fastest one's time. A run on a host with no work under
// way then goes to a fast set instead of the most recently used sandbox's,
// wherever it is.

const (
	// speedEvery is how often at most the pool measures a CPU set while
	// runs come (~6 ms of CPU per CPU each time): a slow spell lasts
	// seconds to minutes, and a measure a few seconds old tells it poorly
	// (of the samples that found a CPU slow, 18 of 35 found it so 5.5 s
	// later, 8 of 35 11 s later).
	speedEvery = 2 * time.Second
	// speedIdle is how long after the last run's request the pool goes
	// on measuring; an idle agent spends nothing on it.
	speedIdle = 30 * time.Second
	// slowerBy is how much longer than the fastest set's time makes a set
	// slow: more than two measures of one CPU a moment apart differ by.
	slowerBy = 1.15
)

// laneLocked picks the CPU set for a sandbox about to be started: the one
// with the fewest sandboxes, live or starting, the first of those that
// tie, and counts the start in it until the sandbox is live or destroyed
// (see open). -1 if the pool pins nothing. p.mu is held.
//
// A tie does not go to a set that is not slow: a slow spell lasts seconds
// and a sandbox stays on its set for up to MaxReuse runs, so the spell at
// its start says little about its life, and the layout it left was
// chance. Two agents alike on one host then held their sandboxes on the
// sets differently (three on the first and two on the second, or the
// other way), and the same runs through them cost up to 1.59x the sandbox
// CPU per run of one in the other (the agent's RATIONALE, "A slow CPU").
func (p *Pool) laneLocked() int {
	if len(p.cfg.CPUSets) == 0 {
		return -1
	}
	n, _ := p.laneLoadLocked()
	best := 0
	for i := range n {
		if n[i] < n[best] {
			best = i
		}
	}
	p.opening[best]++
	return best
}

// doneOpeningLocked ends the start counted by laneLocked. p.mu is held.
func (p *Pool) doneOpeningLocked(lane int) {
	if lane >= 0 {
		p.opening[lane]--
	}
}

// laneLoadLocked returns, per CPU set, the sandboxes live or starting, and
// those of them at work: starting, running or being scrubbed (neither warm
// nor held by a session, whose sandbox is mostly idle). p.mu is held.
func (p *Pool) laneLoadLocked() (sandboxes, working []int) {
	sandboxes = slices.Clone(p.opening)
	working = slices.Clone(p.opening)
	for _, sb := range p.live {
		if sb.lane < 0 {
			continue
		}
		sandboxes[sb.lane]++
		if !sb.held {
			working[sb.lane]++
		}
	}
	for _, sb := range p.warm {
		if sb.lane >= 0 {
			working[sb.lane]--
		}
	}
	return sandboxes, working
}

// pickWarmLocked returns the index in p.warm of the sandbox a stateless
// run takes that wants want prestarted: one with that interpreter
// prestarted first, then one with its language prestarted in the other
// kind (fresh or forked), then any; among those, one on the CPU set with
// the least work under way, then on a set that is not slow, then the most
// recently used. A run that names
// no preloaded module thus takes a fresh interpreter where one waits, and
// leaves the forked ones, whose run and exit cost more, to the runs that
// import what their parents hold. p.mu is held; p.warm is not empty.
func (p *Pool) pickWarmLocked(want wire.Prestart) int {
	var work []int
	if len(p.cfg.CPUSets) > 0 {
		_, work = p.laneLoadLocked()
	}
	best := -1
	var bestMiss, bestWork int
	var bestSlow bool
	for i := len(p.warm) - 1; i >= 0; i-- {
		sb := p.warm[i]
		miss := 0
		if want.Language != "" {
			switch has := sb.Prestarted(); {
			case has.Language != want.Language:
				miss = 2
			case has.Forked != want.Forked:
				miss = 1
			}
		}
		w, slow := 0, false
		if work != nil && sb.lane >= 0 {
			w, slow = work[sb.lane], p.slowLocked(sb.lane)
		}
		if best < 0 || miss < bestMiss || (miss == bestMiss && (w < bestWork || (w == bestWork && bestSlow && !slow))) {
			best, bestMiss, bestWork, bestSlow = i, miss, w, slow
		}
	}
	return best
}

// slowLocked says whether CPU set lane is slow: its last measure took more
// than slowerBy the fastest set's. Unmeasured sets are not. p.mu is held.
func (p *Pool) slowLocked(lane int) bool {
	if lane < 0 || lane >= len(p.speed) || p.speed[lane] == 0 {
		return false
	}
	fastest := p.speed[lane]
	for _, d := range p.speed {
		if d > 0 && d < fastest {
			fastest = d
		}
	}
	return float64(p.speed[lane]) > float64(fastest)*slowerBy
}

// speedLoop measures the CPU sets (measureSets) every speedEvery and
// whenever a sandbox is back from its run, until ctx ends.
func (p *Pool) speedLoop(ctx context.Context) {
	defer p.wg.Done()
	t := time.NewTicker(speedEvery)
	defer t.Stop()
	for {
		p.measureSets()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.laneIdle:
		}
	}
}

// noteLaneIdleLocked tells speedLoop that a sandbox is back from its run,
// so that its set may be idle. p.mu is held.
func (p *Pool) noteLaneIdleLocked() {
	if p.laneIdle == nil {
		return
	}
	select {
	case p.laneIdle <- struct{}{}:
	default:
	}
}

// measureSets measures each CPU set that is due and none of whose
// sandboxes works (a run, a scrub or a start: see cpuset.Speed), and
// records it (p.speed, the metric). A set is due when it has not been
// measured, or when its last measure is speedEvery old and a run asked for
// a sandbox within speedIdle. A set that cannot be measured keeps its last
// measure.
func (p *Pool) measureSets() {
	for lane, set := range p.cfg.CPUSets {
		p.mu.Lock()
		_, work := p.laneLoadLocked()
		due := p.speed[lane] == 0 || (time.Since(p.measuredAt[lane]) >= speedEvery && time.Since(p.lastTake) < speedIdle)
		p.mu.Unlock()
		if work[lane] > 0 || !due {
			continue
		}
		d, err := p.cfg.measureSet(set)
		if err != nil {
			p.log.Warn("measure a CPU set's speed", "cpu_set", set, "error", err)
			continue
		}
		p.cfg.Metrics.measured(set, d)
		p.mu.Lock()
		was := p.slowLocked(lane)
		p.speed[lane], p.measuredAt[lane] = d, time.Now()
		slow := p.slowLocked(lane)
		p.mu.Unlock()
		if slow != was {
			p.log.Debug("CPU set speed changed", "cpu_set", set, "slow", slow, "walk", d)
		}
	}
}

// measureSpeed is Config.measureSet's default: cpuset.Speed on set.
func measureSpeed(set string) (time.Duration, error) {
	cpus, err := cpuset.Parse(set)
	if err != nil {
		return 0, err
	}
	return cpuset.Speed(cpus)
}
