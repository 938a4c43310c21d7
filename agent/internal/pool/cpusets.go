package pool

import "slices"

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

// pickWarmLocked returns the index in p.warm of the sandbox a run in
// language takes: one with that language prestarted before one without,
// then one on the CPU set with the least work under way, then the most
// recently used. p.mu is held; p.warm is not empty.
func (p *Pool) pickWarmLocked(language string) int {
	var work []int
	if len(p.cfg.CPUSets) > 0 {
		_, work = p.laneLoadLocked()
	}
	best := -1
	var bestMiss bool
	var bestWork int
	for i := len(p.warm) - 1; i >= 0; i-- {
		sb := p.warm[i]
		miss := language != "" && sb.Prestarted() != language
		w := 0
		if work != nil && sb.lane >= 0 {
			w = work[sb.lane]
		}
		if best < 0 || (!miss && bestMiss) || (miss == bestMiss && w < bestWork) {
			best, bestMiss, bestWork = i, miss, w
		}
	}
	return best
}
