package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/codemode-go/codemode/internal/testkit/benchbase"
)

// pace is the gap before each run of a paced measurement: a caller that
// thinks between runs, as an agent does, rather than a closed loop.
const pace = 500 * time.Millisecond

// callTimeout bounds one call of a measurement.
const callTimeout = 2 * time.Minute

// job is one run of a workload.
type job struct {
	kind           string // what the run is, for per-kind rows
	language, code string
	// artifact is a file of /workspace/outputs the run writes and must
	// return; "": none.
	artifact string
}

// The programs of the workloads.
var (
	jobPrint = job{kind: "python print(1)", language: "python", code: "print(1)"}
	jobEcho  = job{kind: "bash echo 1", language: "bash", code: "echo 1"}
	// jobCPU is a CPU-bound Python loop of about 100-200 ms.
	jobCPU = job{kind: "python cpu loop", language: "python", code: "s = 0\nfor i in range(1500000):\n    s += i\nprint(s)"}
	// jobBusy spins for 2 s of wall time.
	jobBusy = job{kind: "python 2 s busy loop", language: "python", code: "import time\nt = time.monotonic() + 2\nwhile time.monotonic() < t:\n    pass\nprint(1)"}
)

// mixedJobs is the original's mixed workload, n runs: 70% jobEcho, 20%
// jobCPU and 10% jobBusy (at least one of each from n = 3), in an order
// shuffled with seed.
func mixedJobs(n int, seed int64) []job {
	jobs := make([]job, 0, n)
	busy, cpu := n/10, n/5
	if n >= 3 {
		busy, cpu = max(busy, 1), max(cpu, 1)
	}
	for range busy {
		jobs = append(jobs, jobBusy)
	}
	for range cpu {
		jobs = append(jobs, jobCPU)
	}
	for len(jobs) < n {
		jobs = append(jobs, jobEcho)
	}
	r := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	r.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
	return jobs
}

// sample is one measured call.
type sample struct {
	kind string // of the job
	d    time.Duration
	fail string // kind of failure; "" for success
}

// measurement is the outcome of one workload through one target.
type measurement struct {
	target, workload, mode string
	conc                   int
	samples                []sample
	elapsed                time.Duration
	cpu                    cpuUse // used over elapsed
	newSandboxes           int    // sandboxes of the target's agent started meanwhile, when metered
}

// closed runs jobs through t with conc workers, each taking the next job
// as soon as its last one ended. Each worker first makes warmups (at least
// one) warm-up calls of the first job, one after the other, not measured.
// It fails if a worker cannot dial.
func closed(ctx context.Context, t target, conc, warmups int, jobs []job) (*measurement, error) {
	next := make(chan job, len(jobs))
	for _, j := range jobs {
		next <- j
	}
	close(next)
	callers, err := dialAll(ctx, t, conc)
	defer closeAll(callers)
	if err != nil {
		return nil, err
	}
	warmUp(ctx, callers, max(warmups, 1), jobs[0])
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		samples []sample
	)
	meter, t0 := t.startMeter(), time.Now()
	for _, c := range callers {
		wg.Go(func() {
			for j := range next {
				if ctx.Err() != nil {
					return
				}
				s := timed(ctx, c, j)
				mu.Lock()
				samples = append(samples, s)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	elapsed := time.Since(t0)
	cpu, added := meter()
	return &measurement{target: t.name, conc: conc, mode: "closed", samples: samples, elapsed: elapsed, cpu: cpu, newSandboxes: added}, nil
}

// dialAll dials n callers of t. On an error it returns those dialled so
// far with it, for closeAll.
func dialAll(ctx context.Context, t target, n int) ([]caller, error) {
	callers := make([]caller, 0, n)
	for range n {
		c, err := t.dial(ctx)
		if err != nil {
			return callers, fmt.Errorf("%s: %w", t.name, err)
		}
		callers = append(callers, c)
	}
	return callers, nil
}

func closeAll(callers []caller) {
	for _, c := range callers {
		c.close()
	}
}

// warmUp makes n calls of j through each of callers, the callers at once
// and each one's calls one after the other, and measures none.
func warmUp(ctx context.Context, callers []caller, n int, j job) {
	var wg sync.WaitGroup
	for _, c := range callers {
		wg.Go(func() {
			for range n {
				timed(ctx, c, j)
			}
		})
	}
	wg.Wait()
}

// spread makes n calls of j through t at once, measures none, and waits
// for them: the runs take n warm sandboxes, on as many CPU sets as the
// agent has up to n (a run takes one on the set with the least work under
// way), and each sandbox then prestarts j's interpreter (a sandbox
// prestarts its last run's). A paced stream after it finds j's
// interpreter on every set, and the pool sends each run to one that is
// not slow; after a single warm-up the stream has it in one sandbox only,
// on whichever set that is.
func spread(ctx context.Context, t target, n int, j job) error {
	callers, err := dialAll(ctx, t, n)
	defer closeAll(callers)
	if err != nil {
		return err
	}
	warmUp(ctx, callers, 1, j)
	return ctx.Err()
}

// paced runs jobs through t one at a time, each pace after the end of the
// one before, after two warm-up runs. Its time and CPU count from the end
// of the warm-up, pauses included: the CPU a paced run costs is also what
// its sandbox's scrub and the idle host use until the next.
func paced(ctx context.Context, t target, jobs []job) (*measurement, error) {
	c, err := t.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t.name, err)
	}
	defer c.close()
	var (
		samples []sample
		meter   func() (cpuUse, int)
		t0      time.Time
	)
	for i := range len(jobs) + 2 {
		if i == 2 {
			meter, t0 = t.startMeter(), time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pace):
		}
		s := timed(ctx, c, jobs[max(i-2, 0)])
		if i >= 2 {
			samples = append(samples, s)
		}
	}
	elapsed := time.Since(t0)
	cpu, added := meter()
	return &measurement{target: t.name, conc: 1, mode: "paced", samples: samples, elapsed: elapsed, cpu: cpu, newSandboxes: added}, nil
}

func timed(ctx context.Context, c caller, j job) sample {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	t0 := time.Now()
	err := c.call(ctx, j)
	return sample{kind: j.kind, d: time.Since(t0), fail: classify(err)}
}

func repeat(j job, n int) []job {
	jobs := make([]job, n)
	for i := range jobs {
		jobs[i] = j
	}
	return jobs
}

// stats summarises samples: percentiles over every call (failed or not:
// the latency a caller sees), and failures by kind.
type stats struct {
	n             int
	lat           []time.Duration // each call's, failed ones included
	p50, p95, p99 time.Duration
	rate          float64 // calls per second of elapsed time
	errs          map[string]int
}

func summarize(samples []sample, elapsed time.Duration) stats {
	s := stats{n: len(samples), errs: map[string]int{}}
	lat := make([]time.Duration, 0, len(samples))
	for _, x := range samples {
		lat = append(lat, x.d)
		if x.fail != "" {
			s.errs[x.fail]++
		}
	}
	s.lat = lat
	s.p50, s.p95, s.p99 = benchbase.Percentile(lat, 50), benchbase.Percentile(lat, 95), benchbase.Percentile(lat, 99)
	if elapsed > 0 {
		s.rate = float64(len(samples)) / elapsed.Seconds()
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
