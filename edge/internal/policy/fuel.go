package policy

import (
	"math"

	"github.com/tetratelabs/wazero/api"
)

// fuelGauge is the fuel of one instrumented instance: the globals that
// package wasminterrupt adds, which the guest counts down by one unit per
// loop iteration and function call. Each call is given its budget; a call
// that runs out traps. The zero gauge (a module that is not instrumented)
// does nothing.
type fuelGauge struct {
	fuel, slice api.MutableGlobal
}

// set gives the next call exactly budget units of work.
func (g fuelGauge) set(budget uint64) {
	if g.fuel == nil {
		return
	}
	g.fuel.Set(min(budget, math.MaxInt64))
	g.slice.Set(0)
}

// left is the fuel not used yet.
func (g fuelGauge) left() uint64 {
	if g.fuel == nil {
		return math.MaxInt64
	}
	return g.fuel.Get() + uint64(uint32(g.slice.Get()))
}

// exhausted reports whether the last call used all its fuel: a trap then
// was the guest running out.
func (g fuelGauge) exhausted() bool { return g.fuel != nil && g.left() == 0 }
