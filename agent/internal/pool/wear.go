package pool

import "math/rand/v2"

// retireSpread: each sandbox retires after its own number of runs, drawn
// when it is made between MaxReuse less MaxReuse/retireSpread and
// MaxReuse, not all after MaxReuse.
//
// A replacement is seconds of CPU beside the runs (gVisor's boot, and a
// preloaded parent's imports: ~3 s under runsc). Sandboxes made together (a
// pool's first warm ones, a burst's) serve runs in turn under a steady
// load, and with one bound for all they reach it within a few runs of each
// other and are replaced at once, leaving the runs to the sandboxes left
// while the starts take the CPUs. On an agent with --max-reuse 30 and two
// CPUs, a closed loop of a requests call had two of its three sandboxes
// replaced together twice in 150 runs; for 6-8 s each time its runs took
// p50 360-735 ms, against 135-190 ms between. Drawn bounds spread the
// replacements of sandboxes made together. They do not keep two sandboxes
// made at other times from retiring close together: at --max-reuse 30,
// with eight values to draw from, two sandboxes still retired within 2 s
// of each other in each of four such loops. At the default 100 there are
// 26 values. No sandbox serves more than
// MaxReuse runs; a pool whose MaxReuse is below retireSpread draws none.
const retireSpread = 4

// drawRetireAt returns the number of runs a new sandbox serves before it
// is replaced.
func (p *Pool) drawRetireAt() int {
	return p.cfg.MaxReuse - rand.IntN(p.cfg.MaxReuse/retireSpread+1)
}
