//go:build unix

package policy

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user + system) the process has used:
// benchmarks report it next to wall time, which on a shared machine also
// counts time spent waiting for a CPU.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
