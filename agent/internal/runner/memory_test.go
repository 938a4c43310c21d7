package runner

import (
	"syscall"
	"testing"
	"time"
)

func TestDiedOfMemory(t *testing.T) {
	const limit = 256 << 20
	killed := syscall.WaitStatus(syscall.SIGKILL) // signalled, no core
	terminated := syscall.WaitStatus(syscall.SIGTERM)
	exited := syscall.WaitStatus(137 << 8) // exit(137), not a signal
	for _, tc := range []struct {
		name string
		st   stopped
		ws   syscall.WaitStatus
		want bool
	}{
		{"SIGKILL after using most of the memory", stopped{memPeak: 200 << 20, memLimit: limit}, killed, true},
		{"SIGKILL at half the limit", stopped{memPeak: limit / 2, memLimit: limit}, killed, true},
		{"SIGKILL with little memory used (kill -9 by the program)", stopped{memPeak: 40 << 20, memLimit: limit}, killed, false},
		{"SIGKILL with the limit unknown", stopped{memPeak: 200 << 20}, killed, false},
		{"killed by the runner at the timeout", stopped{timedOut: true, memPeak: 200 << 20, memLimit: limit}, killed, false},
		{"killed by the runner on cancel", stopped{cancelled: true, memPeak: 200 << 20, memLimit: limit}, killed, false},
		{"another signal", stopped{memPeak: 200 << 20, memLimit: limit}, terminated, false},
		{"exit status 137", stopped{memPeak: 200 << 20, memLimit: limit}, exited, false},
	} {
		if got := tc.st.diedOfMemory(tc.ws); got != tc.want {
			t.Errorf("%s: diedOfMemory = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// The watchdog looks more often near its threshold, where a fast allocator
// could cross the rest of the headroom between two polls.
func TestMemoryPollAfter(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		u, threshold uint64
		want         time.Duration
	}{
		{0, 448 * mib, memoryPoll},
		{300 * mib, 448 * mib, memoryPoll},
		{320 * mib, 448 * mib, memoryPollNear},
		{440 * mib, 448 * mib, memoryPollNear},
		{500 * mib, 448 * mib, memoryPollNear},
		{100 * mib, 64 * mib, memoryPollNear},
	} {
		if got := memoryPollAfter(tc.u, tc.threshold); got != tc.want {
			t.Errorf("memoryPollAfter(%d MiB, %d MiB) = %v, want %v", tc.u/mib, tc.threshold/mib, got, tc.want)
		}
	}
}
