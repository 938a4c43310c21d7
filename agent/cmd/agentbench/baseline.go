package main

import (
	"context"

	"github.com/codemode-go/codemode/internal/testkit/benchbase"
)

// baselines measures, in one warm runsc container from the agent's image,
// with the agent's CPU limit, what the agent is compared with: docker exec
// of an interpreter, and interpreter starts inside the sandbox in one loop
// and in four.
func (b *bench) baselines(ctx context.Context, r *report) error {
	b.logf("starting the baseline container")
	b.baseline = &benchbase.Baseline{Docker: b.docker, Image: b.o.image, Runtime: b.o.runtime, CPUs: b.o.cpus, Pin: true,
		Labels: map[string]string{"codemode.bench": "1"}}
	if err := b.baseline.Start(ctx); err != nil {
		return err
	}
	b.logf("docker exec baseline")
	lat, _, err := b.baseline.ExecLatency(ctx, b.o.execN)
	if err != nil {
		return err
	}
	r.exec = runs{lat: lat} // timed one by one: the rate is over their sum
	b.logf("python start inside the sandbox")
	if r.start1, err = b.baseline.StartLoop(ctx, 1, b.o.loopN); err != nil {
		return err
	}
	r.start4, err = b.baseline.StartLoop(ctx, 4, b.o.loopN)
	return err
}
