package pool

import "fmt"

// A state is where a sandbox the pool counts is in its life. Every such
// sandbox is in exactly one state; warm ones are also on Pool.warm, and the
// pool counts the others per state (Pool.n).
//
//	starting ──► warm ◄─────── recycling
//	                │              ▲
//	direct ──────► busy ───────────┘
//	                │
//	                ▼
//	               held
//
// Any state may also end: the start failed, or the sandbox was destroyed
// (it died, idled out, served its most runs, its scrub failed, its session
// ended, the engine went away, the pool closed).
type state int

const (
	starting  state = iota // a warm start under way: not yet a Sandbox
	direct                 // started for a caller that waits for it: not yet a Sandbox
	warm                   // started (or scrubbed) and idle, on Pool.warm
	busy                   // taken for a stateless run
	held                   // taken by a session until it ends
	recycling              // given back after a run and being scrubbed
	numStates
)

var stateNames = [numStates]string{"starting", "direct", "warm", "busy", "held", "recycling"}

func (s state) String() string {
	if s < 0 || s >= numStates {
		return fmt.Sprintf("state(%d)", int(s))
	}
	return stateNames[s]
}

// transitions lists, for each state, the states a sandbox may move to.
var transitions = [numStates][]state{
	starting:  {warm},
	direct:    {busy},
	warm:      {busy},
	busy:      {recycling, held},
	held:      nil,
	recycling: {warm},
}

func canMove(from, to state) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// enterLocked counts one more sandbox in s, which is starting or direct
// (the others are entered by move). p.mu is held.
func (p *Pool) enterLocked(s state) {
	if s != starting && s != direct {
		panic(fmt.Sprintf("pool: a sandbox cannot begin %v", s))
	}
	p.n[s]++
	p.broadcastLocked()
}

// moveLocked moves one sandbox from one state to the next; warm is counted
// by Pool.warm, which the caller changes. p.mu is held.
func (p *Pool) moveLocked(from, to state) {
	if !canMove(from, to) {
		panic(fmt.Sprintf("pool: no transition from %v to %v", from, to))
	}
	if from != warm {
		p.n[from]--
	}
	if to != warm {
		p.n[to]++
	}
	p.broadcastLocked()
}

// endLocked forgets one sandbox in s: its start failed or it is being
// destroyed. p.mu is held.
func (p *Pool) endLocked(s state) {
	if s != warm {
		p.n[s]--
	}
	p.broadcastLocked()
}

// totalLocked is the number of sandboxes counted against Config.Max.
// p.mu is held.
func (p *Pool) totalLocked() int {
	t := len(p.warm)
	for _, n := range p.n {
		t += n
	}
	return t
}

// incomingLocked is the number of sandboxes on their way to the warm list.
// p.mu is held.
func (p *Pool) incomingLocked() int { return p.n[starting] + p.n[recycling] }
