package pool

import (
	"slices"

	"github.com/codemode-go/codemode/agent/internal/wire"
)

// Sandboxes pinned to CPU sets (Config.CPUSets; package internal/cpuset
// says why). The pool spreads sandboxes evenly over the sets, and a run takes
// a warm sandbox on the set with the least work under way.

// laneLocked picks the CPU set for a sandbox about to be started: the one
// with the fewest sandboxes, live or starting, and counts the start in it
// until the sandbox is live or destroyed (see open). -1 if the pool pins
// nothing. p.mu is held.
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
// the least work under way, then the most recently used. A run that names
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
		w := 0
		if work != nil && sb.lane >= 0 {
			w = work[sb.lane]
		}
		if best < 0 || miss < bestMiss || (miss == bestMiss && w < bestWork) {
			best, bestMiss, bestWork = i, miss, w
		}
	}
	return best
}
