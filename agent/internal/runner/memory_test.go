package runner

import (
	"os"
	"path/filepath"
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

// The watchdog looks more often where usage grows toward its threshold,
// and, before it has seen usage grow, where usage is near it.
func TestMemoryPollAfter(t *testing.T) {
	const mib = 1 << 20
	const ms = time.Millisecond
	for _, tc := range []struct {
		name                 string
		u, threshold, growth uint64
		elapsed              time.Duration
		want                 time.Duration
	}{
		{"first look, far", 0, 448 * mib, 0, 0, memoryPoll},
		{"first look, below the band", 300 * mib, 448 * mib, 0, 0, memoryPoll},
		{"first look, in the band", 320 * mib, 448 * mib, 0, 0, memoryPollNear},
		{"first look, at the threshold", 440 * mib, 448 * mib, 0, 0, memoryPollNear},
		{"over the threshold", 500 * mib, 448 * mib, 0, 10 * ms, memoryPollNear},
		{"not growing, near", 440 * mib, 448 * mib, 0, 10 * ms, memoryPoll},
		{"not growing, far", 100 * mib, 448 * mib, 0, 10 * ms, memoryPoll},
		// 1.6 GiB/s: 128 MiB left is 80 ms, 20 ms a look.
		{"growing, 128 MiB left", 320 * mib, 448 * mib, 16 * mib, 10 * ms, memoryPoll},
		// 32 MiB left is 20 ms, 5 ms a look.
		{"growing, 32 MiB left", 416 * mib, 448 * mib, 16 * mib, 10 * ms, 5 * ms},
		{"growing, 4 MiB left", 444 * mib, 448 * mib, 16 * mib, 10 * ms, memoryPollNear},
		// 16 MiB in 1 ms, 16 GiB/s: 256 MiB left is 16 ms, 4 ms a look;
		// 48 MiB left, 0.75 ms, is at the fastest.
		{"growing fast, 256 MiB left", 192 * mib, 448 * mib, 16 * mib, ms, 4 * ms},
		{"growing fast, 48 MiB left", 400 * mib, 448 * mib, 16 * mib, ms, memoryPollNear},
		// 200 MiB/s: 8 MiB left is 40 ms.
		{"growing slowly, near", 440 * mib, 448 * mib, 2 * mib, 10 * ms, memoryPoll},
	} {
		if got := memoryPollAfter(tc.u, tc.threshold, tc.growth, tc.elapsed); got != tc.want {
			t.Errorf("%s: memoryPollAfter(%d MiB, %d MiB, %d KiB in %v) = %v, want %v", tc.name, tc.u/mib, tc.threshold/mib, tc.growth>>10, tc.elapsed, got, tc.want)
		}
	}
}

func TestMeminfoUsed(t *testing.T) {
	// As gVisor writes it (pkg/sentry/fsimpl/proc), and as Linux does.
	gvisor := "MemTotal:         524288 kB\nMemFree:          262144 kB\nMemAvailable:     262144 kB\nBuffers:               0 kB\n"
	linux := "MemTotal:        4012564 kB\nMemFree:          112340 kB\nMemAvailable:    2912340 kB\n"
	for _, tc := range []struct {
		name, in string
		want     uint64
		ok       bool
	}{
		{"gVisor", gvisor, 256 << 20, true},
		{"Linux", linux, (4012564 - 112340) << 10, true},
		{"free first", "MemFree: 1 kB\nMemTotal: 3 kB\n", 2 << 10, true},
		{"free above total", "MemTotal: 3 kB\nMemFree: 5 kB\n", 0, true},
		{"no MemFree", "MemTotal: 3 kB\nMemAvailable: 1 kB\n", 0, false},
		{"cut short", gvisor[:30], 0, false},
		{"not a number", "MemTotal: x kB\nMemFree: 1 kB\n", 0, false},
		{"not kB", "MemTotal: 3 MB\nMemFree: 1 MB\n", 0, false},
		{"empty", "", 0, false},
	} {
		got, ok := meminfoUsed([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: meminfoUsed = %d, %v; want %d, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// The watchdog reads /proc/meminfo between its reads of the cgroup only
// where the two agree, as under gVisor; elsewhere (a whole host's memory)
// every look reads the cgroup.
func TestOpenMemoryFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	write("memory.usage_in_bytes", "268435456\n") // 256 MiB
	write("memory.limit_in_bytes", "536870912\n")
	for _, tc := range []struct {
		name, meminfo string
		want          bool
	}{
		{"same", "MemTotal: 2097152 kB\nMemFree: 1835008 kB\n", true},                  // 256 MiB used
		{"within the agreement", "MemTotal: 2097152 kB\nMemFree: 1826816 kB\n", true},  // 264 MiB
		{"a host's memory", "MemTotal: 4012564 kB\nMemFree: 112340 kB\n", false},       // 3.7 GiB
		{"less than the cgroup", "MemTotal: 2097152 kB\nMemFree: 1900544 kB\n", false}, // 192 MiB
		{"unreadable", "garbage\n", false},
	} {
		m := openMemoryFiles(dir, write("meminfo", tc.meminfo))
		if got := m.meminfo != nil; got != tc.want {
			t.Errorf("%s: meminfo used = %v, want %v", tc.name, got, tc.want)
		}
		u, ok := m.read(false)
		want := uint64(256 << 20)
		if tc.name == "within the agreement" {
			want = 264 << 20
		}
		if !ok || u != want {
			t.Errorf("%s: read(false) = %d, %v; want %d", tc.name, u, ok, want)
		}
		if u, ok := m.read(true); !ok || u != 256<<20 {
			t.Errorf("%s: read(true) = %d, %v; want the cgroup's", tc.name, u, ok)
		}
		m.close()
	}
	if m := openMemoryFiles(dir, ""); m.meminfo != nil || m.usage == nil {
		t.Errorf("without a meminfo path: %+v", m)
	}
	if m := openMemoryFiles("", filepath.Join(dir, "meminfo")); m.usage != nil || m.meminfo != nil {
		t.Errorf("without a cgroup: %+v", m)
	}
}
