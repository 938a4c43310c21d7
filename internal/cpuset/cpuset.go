// Package cpuset splits the host's CPUs into sets that sandboxes are pinned
// to, in Docker's --cpuset-cpus syntax.
//
// Under gVisor's systrap platform a sandbox's kernel and its stub processes
// trade every system call between threads. Under a CPU quota with no
// pinning those threads move between all the host's CPUs, each move a
// cross-CPU wakeup, and the quota throttles the sandbox once they have run
// on several CPUs at once. A sandbox pinned to as many CPUs as its limit
// gives it does neither, and it sees as many CPUs as it may use.
package cpuset

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Host returns the CPUs this process may run on, in order.
func Host() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("read the CPUs this process may use: %w", err)
	}
	var cpus []int
	for i := range len(set) * 64 {
		if set.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	return cpus, nil
}

// Split splits cpus into as many sets of at least ceil(limit) CPUs each as
// they hold, in order and as even as they divide. Fewer than two sets would
// pin nothing worth pinning: Split then returns nil.
func Split(cpus []int, limit float64) []string {
	per := max(int(math.Ceil(limit)), 1)
	n := len(cpus) / per
	if n < 2 {
		return nil
	}
	cpus = slices.Sorted(slices.Values(cpus))
	sets := make([]string, n)
	for i := range n {
		sets[i] = List(cpus[i*len(cpus)/n : (i+1)*len(cpus)/n])
	}
	return sets
}

// List writes sorted cpus as CPUs and ranges: "0-2,5".
func List(cpus []int) string {
	var b strings.Builder
	for i := 0; i < len(cpus); {
		j := i
		for j+1 < len(cpus) && cpus[j+1] == cpus[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j == i {
			fmt.Fprint(&b, cpus[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", cpus[i], cpus[j])
		}
		i = j + 1
	}
	return b.String()
}
