package cpuset

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Parse reads a CPU list such as "0-2,5" (List's form, and the kernel's).
func Parse(list string) ([]int, error) {
	var cpus []int
	for part := range strings.SplitSeq(list, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a < 0 {
			return nil, fmt.Errorf("CPU list %q: bad CPU %q", list, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("CPU list %q: bad range %q", list, part)
			}
		}
		for c := a; c <= b; c++ {
			cpus = append(cpus, c)
		}
	}
	slices.Sort(cpus)
	return slices.Compact(cpus), nil
}

// speedChase is how many entries (4 bytes each) the buffer Speed walks
// holds: 1 MiB, more than a core's own L2 cache of the CPUs codemode is
// measured on (0.5 MiB), so that the walk waits on the cache they share
// with other cores; speedSteps is how many steps one round times (~1 ms
// of a CPU of this kind).
const (
	speedChase = 1 << 18
	speedSteps = 1 << 17
)

// speedRounds is how many times Speed times the walk on each CPU; it takes
// the median.
const speedRounds = 3

// chase is a random cycle through speedChase entries: chase[i] is the
// entry after i. Made once, on first use.
var chase = sync.OnceValue(func() []uint32 {
	order := make([]uint32, speedChase)
	for i := range order {
		order[i] = uint32(i)
	}
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	c := make([]uint32, speedChase)
	for i, e := range order {
		c[e] = order[(i+1)%len(order)]
	}
	return c
})

// Speed returns the CPU time a fixed walk through memory takes on the CPUs
// of cpus, the mean over them of each one's median of speedRounds rounds.
//
// The virtual CPUs of a machine do not all deliver the same, and not for
// lack of time: what one of them shares with another guest's work (a
// cache, when the hypervisor puts the two on neighbouring cores) slows
// everything on it that waits on memory, while a loop that computes in
// registers runs as fast as on the others. On the 2-CPU machines codemode
// is measured on, one CPU at times took 1.6x as long as the other for a
// shell loop, 1.3x for numpy's eigenvalues of a 500x500 matrix in a
// sandbox and 1.5-1.6x for this walk (a 1 MiB random cycle, the walk's
// first pass uncounted), while a multiply loop took the same on both; for
// ten seconds to minutes, then the other CPU, or neither. So Speed times a
// walk that waits on the shared cache, not arithmetic. It reads the
// thread's CPU time, not the wall clock, so that the turns other threads
// take on the CPU do not count; they still evict some of the walk from the
// caches, so a CPU is best measured while nothing else runs on it.
//
// The calling goroutine is locked to its thread and pinned to each CPU in
// turn. If its thread's CPUs cannot be given back, the goroutine stays
// locked to it, so that no other goroutine runs pinned; the runtime ends
// the thread when the goroutine ends.
func Speed(cpus []int) (time.Duration, error) {
	if len(cpus) == 0 {
		return 0, errors.New("speed: no CPU")
	}
	runtime.LockOSThread()
	var was unix.CPUSet
	if err := unix.SchedGetaffinity(0, &was); err != nil {
		runtime.UnlockOSThread()
		return 0, fmt.Errorf("speed: read this thread's CPUs: %w", err)
	}
	d, err := timeCPUs(cpus)
	if err2 := unix.SchedSetaffinity(0, &was); err2 != nil {
		return 0, fmt.Errorf("speed: unpin: %w", err2)
	}
	runtime.UnlockOSThread()
	return d, err
}

// timeCPUs is Speed on a thread locked to its goroutine.
func timeCPUs(cpus []int) (time.Duration, error) {
	var sum time.Duration
	for _, c := range cpus {
		var one unix.CPUSet
		one.Set(c)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			return 0, fmt.Errorf("speed: pin to CPU %d: %w", c, err)
		}
		// A first pass, uncounted, brings the buffer into the caches.
		buf := chase()
		p := walk(buf, 0, len(buf))
		rounds := make([]time.Duration, speedRounds)
		for i := range rounds {
			d, err := timeSteps(buf, &p)
			if err != nil {
				return 0, err
			}
			rounds[i] = d
		}
		slices.Sort(rounds)
		sum += rounds[len(rounds)/2]
	}
	return sum / time.Duration(len(cpus)), nil
}

// timeSteps walks speedSteps steps through buf from *p, leaves *p where
// it ends, and returns their CPU time.
func timeSteps(buf []uint32, p *uint32) (time.Duration, error) {
	var a, b unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &a); err != nil {
		return 0, fmt.Errorf("speed: read the thread's CPU time: %w", err)
	}
	*p = walk(buf, *p, speedSteps)
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &b); err != nil {
		return 0, fmt.Errorf("speed: read the thread's CPU time: %w", err)
	}
	sink.Store(*p)
	return time.Duration(b.Nano() - a.Nano()), nil
}

// sink keeps walk's result alive, so that the compiler keeps the loop; it
// is stored atomically, since pools measure at once.
var sink atomic.Uint32

// walk takes n steps through c from p and returns where it ends. Each step
// waits for the one before it.
//
//go:noinline
func walk(c []uint32, p uint32, n int) uint32 {
	for range n {
		p = c[p]
	}
	return p
}
