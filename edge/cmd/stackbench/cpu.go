package main

import (
	"time"

	"github.com/codemode-go/codemode/internal/testkit/benchbase"
	"github.com/codemode-go/codemode/internal/testkit/launch"
)

// cpuUse is CPU time: the whole host's busy time (every CPU, everything
// running: the sandboxes' gVisor kernels, the container engine, the
// services, the bench itself, and other tenants of the machine), each
// service process's own, and, where measured, the agent's sandboxes'
// (their cgroups).
type cpuUse struct{ host, agent, cp, edge, sandbox time.Duration }

func (u cpuUse) add(o cpuUse) cpuUse {
	return cpuUse{u.host + o.host, u.agent + o.agent, u.cp + o.cp, u.edge + o.edge, u.sandbox + o.sandbox}
}

func (u cpuUse) sub(o cpuUse) cpuUse {
	return cpuUse{u.host - o.host, u.agent - o.agent, u.cp - o.cp, u.edge - o.edge, u.sandbox - o.sandbox}
}

// per is u divided among n runs; zero for none.
func (u cpuUse) per(n int) cpuUse {
	if n <= 0 {
		return cpuUse{}
	}
	d := time.Duration(n)
	return cpuUse{u.host / d, u.agent / d, u.cp / d, u.edge / d, u.sandbox / d}
}

// meter reads t's CPU use so far; zero when t is not metered.
func (t target) meter() cpuUse {
	if t.cpu == nil {
		return cpuUse{}
	}
	return t.cpu()
}

// waitQuiet runs t's quiet wait, if it has one.
func (t target) waitQuiet() {
	if t.quiet != nil {
		t.quiet()
	}
}

// startMeter starts measuring t's CPU use; the function it returns reads
// the use since, and how many sandboxes appeared meanwhile (when t's
// sandboxes are metered). Where t has a quiet wait, both readings are
// taken with t's agent quiet, so that the use is that of the runs between
// them with their scrubs, the last one's included, and nothing of what
// came before (see [bench.waitQuiet]).
func (t target) startMeter() func() (cpuUse, int) {
	t.waitQuiet()
	c0 := t.meter()
	var s0 map[string]time.Duration
	if t.sandboxes != nil {
		s0 = t.sandboxes()
	}
	return func() (cpuUse, int) {
		t.waitQuiet()
		u := t.meter().sub(c0)
		if t.sandboxes == nil {
			return u, 0
		}
		s1 := t.sandboxes()
		u.sandbox = sandboxDelta(s0, s1)
		added := 0
		for id := range s1 {
			if _, ok := s0[id]; !ok {
				added++
			}
		}
		return u, added
	}
}

// cpuMeter reads the host's CPU use and the agent's, the control plane's
// and edge's (none for a nil edge: the agent's own API). What cannot be
// read counts as zero.
func (b *bench) cpuMeter(edge *launch.Process) func() cpuUse {
	return cpuMeterOf(b.agent, b.cp, edge)
}

// cpuMeterOf reads the host's CPU use and that of agent, cp and edge
// (none for a nil one).
func cpuMeterOf(agent, cp, edge *launch.Process) func() cpuUse {
	return func() cpuUse {
		var u cpuUse
		u.host, _ = benchbase.HostCPU()
		u.agent = processCPU(agent)
		u.cp = processCPU(cp)
		u.edge = processCPU(edge)
		return u
	}
}

func processCPU(p *launch.Process) time.Duration {
	if p == nil {
		return 0
	}
	d, _ := benchbase.ProcessCPU(p.Pid())
	return d
}
