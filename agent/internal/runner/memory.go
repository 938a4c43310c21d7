package runner

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/codemode-go/codemode/agent/internal/runner/rawfile"
	"github.com/codemode-go/codemode/agent/internal/runner/stdio"
)

// memoryPoll is how often the memory watchdog looks at the sandbox's usage
// while a run is going and far from its threshold.
const memoryPoll = 10 * time.Millisecond

// memoryPollNear is how often it looks when usage is within
// memoryNearThreshold of the threshold, where an allocator faster than a
// few GiB/s (one Python loop of bytearray(16 << 20)) could otherwise cross
// the rest of the headroom between two polls, or while the watchdog waits
// for a CPU on a loaded host. A look and the wake-up before it cost the
// sandbox 0.5-0.8 ms of CPU pinned, more unpinned (the RATIONALE's "Where
// a forked run's cost is"), so the fast polling is paid only near the
// limit.
const (
	memoryPollNear      = time.Millisecond
	memoryNearThreshold = 128 << 20
)

// memoryPollAfter is the wait before the next look at usage u.
func memoryPollAfter(u, threshold uint64) time.Duration {
	if u+memoryNearThreshold >= threshold {
		return memoryPollNear
	}
	return memoryPoll
}

// memoryHeadroom is what the watchdog keeps free below the sandbox's memory
// limit. Under gVisor the host's OOM killer kills the whole sandbox (runner
// included) when the limit is reached, so the runner kills the run a little
// before that, and the sandbox survives to report it. The sandbox kernel's
// own overhead counts against the host limit but not in the usage gVisor
// reports, hence the margin.
func memoryHeadroom(limit uint64) uint64 {
	return max(limit/8, 24<<20)
}

// memoryFiles are the sandbox's memory cgroup files, opened once: a read
// at offset 0 of an open control file gives the current value, at a
// quarter of the cost of opening, reading and closing it under gVisor
// (~0.1 ms against ~0.45 ms), and the watchdog reads it every memoryPoll.
type memoryFiles struct {
	usage, limit *os.File // nil: not available
}

func openMemoryFiles(dir string) memoryFiles {
	if dir == "" {
		return memoryFiles{}
	}
	var m memoryFiles
	if f, err := os.Open(filepath.Join(dir, "memory.usage_in_bytes")); err == nil {
		if _, ok := preadUint(f); ok {
			m.usage = f
		} else {
			f.Close()
		}
	}
	if f, err := os.Open(filepath.Join(dir, "memory.limit_in_bytes")); err == nil {
		m.limit = f
	}
	return m
}

func (m memoryFiles) close() {
	stdio.CloseAll(m.usage, m.limit)
}

// memWatch is the memory watchdog of one run.
type memWatch struct {
	fired chan struct{} // closed when usage crossed the threshold; nil: never
	peak  atomic.Uint64 // the most usage seen during the run
	limit uint64        // the sandbox's limit; 0: unknown
}

// watchMemory starts watching the sandbox's memory usage until done is
// closed. Its fired channel is closed if usage comes within memoryHeadroom of
// the sandbox's limit, or reaches runLimit (if not 0), above what a
// preloaded parent held when the run began. Without a readable
// memory cgroup, or without any limit, fired is nil (never ready).
func (s *server) watchMemory(done <-chan struct{}, runLimit uint64) *memWatch {
	w := &memWatch{}
	usage := s.memory.usage
	if usage == nil {
		return w
	}
	threshold := uint64(1<<64 - 1)
	// Read per run: the limit of a running container can be changed.
	limit, ok := preadUint(s.memory.limit)
	if ok && limit > 0 && limit < 1<<62 {
		threshold = limit - min(limit, memoryHeadroom(limit))
		w.limit = limit
	}
	if runLimit > 0 {
		// Beside a preloaded parent, the sandbox holds the parent's
		// memory before the run does anything: the run's own limit is
		// counted above what the sandbox held when it began.
		var base uint64
		if s.holdsParent() {
			base, _ = preadUint(usage)
		}
		threshold = min(threshold, base+runLimit)
	}
	if threshold == 1<<64-1 {
		return w
	}
	w.fired = make(chan struct{})
	go func() {
		t := time.NewTimer(memoryPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				u, ok := preadUint(usage)
				if !ok {
					t.Reset(memoryPoll)
					continue
				}
				t.Reset(memoryPollAfter(u, threshold))
				if u > w.peak.Load() {
					w.peak.Store(u)
				}
				if u >= threshold {
					s.cfg.log.Warn("memory limit reached: killing the run", "usage", u, "threshold", threshold)
					close(w.fired)
					return
				}
			}
		}
	}()
	return w
}

// diedOfMemory reports whether a run whose main process ended with ws most
// likely died for memory although the watchdog did not stop it: killed by
// a SIGKILL the runner did not send, after the sandbox's memory use had
// passed half its limit. Under gVisor the sandbox kernel kills a process
// that runs it out of memory; a fast enough allocator gets there between two
// polls of the watchdog.
func (st stopped) diedOfMemory(ws syscall.WaitStatus) bool {
	return !st.timedOut && !st.cancelled && !st.oom &&
		ws.Signaled() && ws.Signal() == syscall.SIGKILL &&
		st.memLimit > 0 && st.memPeak >= st.memLimit/2
}

// preadUint reads the number in a control file from its start, in one
// system call (os.File.ReadAt would read again to reach the end).
func preadUint(f *os.File) (uint64, bool) {
	if f == nil {
		return 0, false
	}
	var buf [32]byte
	b, err := rawfile.Pread(int(f.Fd()), buf[:])
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(string(bytes.TrimSpace(b)), 10, 64)
	return v, err == nil
}
