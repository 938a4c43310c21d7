package pool

import "math/rand/v2"

// retireSpread: each sandbox retires after its own number of runs, drawn
// when it is made between MaxReuse less MaxReuse/retireSpread and
// MaxReuse, not all after MaxReuse.
//
// A replacement is seconds of CPU beside the runs (gVisor's boot, and a
// preloaded parent's imports: ~4 s under runsc). Sandboxes made together (a
// pool's first warm ones, a burst's) serve runs in turn under a steady
// load, and with one bound for all they reach it within a few runs of each
// other and are replaced at once, leaving the runs to the sandboxes left
// while the starts take the CPUs; their replacements, made together too,
// do the same a generation later. On an agent with --max-reuse 30 and two
// CPUs, a closed loop of a requests call had two of its three sandboxes
// replaced together twice in 150 runs; for 6-8 s each time its runs took
// p50 360-735 ms, against 135-190 ms between.
//
// Drawn bounds put the replacements of sandboxes made together apart: at
// the default 100, by up to ten runs each, which in a pool of three or four
// taking runs in turn is about as many seconds as a start takes. They do
// not keep sandboxes made at other times from retiring close together. The
// spread is narrow because every run it takes off a sandbox's life is paid
// for: a tenth costs about 5% more replacements on average (a quarter
// would cost 14%, and a preloaded sandbox's start, ~4 s of CPU, is already
// ~45 ms of each of its runs' share). No sandbox serves more than MaxReuse
// runs; a pool whose MaxReuse is below retireSpread draws none.
const retireSpread = 10

// drawRetireAt returns the number of runs a new sandbox serves before it
// is replaced.
func (p *Pool) drawRetireAt() int {
	return p.cfg.MaxReuse - rand.IntN(p.cfg.MaxReuse/retireSpread+1)
}
