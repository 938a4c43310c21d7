package runner

import (
	"syscall"
	"testing"
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
