package main

import (
	"time"

	"github.com/codemode-go/codemode/internal/testkit/benchbase"
	"github.com/codemode-go/codemode/internal/testkit/launch"
)

// cpuUse is CPU time: the whole host's busy time (every CPU, everything
// running: the sandboxes' gVisor kernels, the container engine, the
// services, the bench itself, and other tenants of the machine), and each
// service process's own.
type cpuUse struct{ host, agent, cp, edge time.Duration }

func (u cpuUse) add(o cpuUse) cpuUse {
	return cpuUse{u.host + o.host, u.agent + o.agent, u.cp + o.cp, u.edge + o.edge}
}

func (u cpuUse) sub(o cpuUse) cpuUse {
	return cpuUse{u.host - o.host, u.agent - o.agent, u.cp - o.cp, u.edge - o.edge}
}

// per is u divided among n runs; zero for none.
func (u cpuUse) per(n int) cpuUse {
	if n <= 0 {
		return cpuUse{}
	}
	d := time.Duration(n)
	return cpuUse{u.host / d, u.agent / d, u.cp / d, u.edge / d}
}

// meter reads t's CPU use so far; zero when t is not metered.
func (t target) meter() cpuUse {
	if t.cpu == nil {
		return cpuUse{}
	}
	return t.cpu()
}

// cpuMeter reads the host's CPU use and the agent's, the control plane's
// and edge's (none for a nil edge: the agent's own API). What cannot be
// read counts as zero.
func (b *bench) cpuMeter(edge *launch.Process) func() cpuUse {
	return func() cpuUse {
		var u cpuUse
		u.host, _ = benchbase.HostCPU()
		u.agent = processCPU(b.agent)
		u.cp = processCPU(b.cp)
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
