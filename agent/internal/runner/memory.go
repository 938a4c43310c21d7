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
// while a run is going, at most.
const memoryPoll = 10 * time.Millisecond

// memoryPollNear is the shortest wait between two looks, which the
// watchdog keeps while usage grows fast enough to reach the threshold
// within a few looks: an allocator of a few GiB/s (one Python loop of
// bytearray(16 << 20)) could otherwise cross the rest of the headroom
// between two, or while the watchdog waits for a CPU on a loaded host. Its
// looks between two reads of the cgroup's usage (at most memoryPoll apart)
// read /proc/meminfo, which gVisor answers at a twentieth of the cost (see
// memoryFiles).
//
// Each look wakes the watchdog, and under gVisor the wake-up, not the
// read, is what the run pays: a loop in node beside the preloaded parents
// took 1.39-1.43x as long with looks every millisecond as with looks every
// memoryPoll (BenchmarkSandboxNearMemoryLimit). So usage that does not
// grow is looked at every memoryPoll however near the threshold it sits.
const memoryPollNear = time.Millisecond

// memoryNearThreshold is how near the threshold a run's first look must
// find usage for the next to come after memoryPollNear: the watchdog has
// not seen usage grow yet.
const memoryNearThreshold = 128 << 20

// memoryPollMargin is how many looks at least the watchdog plans before
// usage growing as fast as between its last two would reach the
// threshold.
const memoryPollMargin = 4

// memoryPollAfter is the wait before the next look at usage u, which grew
// by growth in the last elapsed (elapsed 0: the run's first look, growth
// unknown).
func memoryPollAfter(u, threshold, growth uint64, elapsed time.Duration) time.Duration {
	if u >= threshold {
		return memoryPollNear
	}
	if elapsed <= 0 {
		if u+memoryNearThreshold >= threshold {
			return memoryPollNear
		}
		return memoryPoll
	}
	if growth == 0 {
		return memoryPoll
	}
	// The time usage would take to reach the threshold, growing as it did,
	// shared by memoryPollMargin looks.
	d := time.Duration(float64(threshold-u) / float64(growth) * float64(elapsed) / memoryPollMargin)
	return min(max(d, memoryPollNear), memoryPoll)
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

// memoryFiles are the sandbox's memory files, opened once: a read at offset
// 0 of an open control file gives the current value, at a quarter of the
// cost of opening, reading and closing it under gVisor (~0.1 ms against
// ~0.45 ms).
//
// A read of the cgroup's memory.usage_in_bytes makes gVisor scan every page
// of the sandbox's memory file not yet known to be in use (pgalloc's
// UpdateUsage, asking the host with mincore(2)), holding up the sandbox's
// allocations meanwhile: 0.13 ms with nothing running, 0.4 ms beside the
// preloaded parents, whose memory is mostly such pages. /proc/meminfo
// gives the same total (the container's memory cgroup is gVisor's root,
// whose usage is its whole accounting) and scans at most once per 10 ms
// (or eight times the last scan's length), whoever asks: ~0.02 ms a read. So the watchdog
// reads the cgroup's usage every memoryPoll and, near its threshold,
// /proc/meminfo between those reads: what gVisor commits itself (a large
// allocation) shows at once, and pages the program writes show within one
// of its scans, as fresh as a read of the cgroup every memoryPoll.
type memoryFiles struct {
	usage, limit *os.File // nil: not available
	// meminfo is /proc/meminfo where it agrees with usage; nil elsewhere
	// (outside gVisor it tells the whole host's memory).
	meminfo *os.File
}

// meminfoUnusable is the runner's warning when /proc/meminfo does not tell
// the cgroup's usage: the watchdog then reads the cgroup at every look, and
// code near the limit pays for it (see memoryFiles).
const meminfoUnusable = "the memory watchdog reads the cgroup at every look: /proc/meminfo disagrees with it"

// meminfoAgreement is how far /proc/meminfo's used memory may lie from the
// cgroup's usage, read on either side of it, for the watchdog to use it:
// under gVisor the two differ by what was allocated between the reads.
const meminfoAgreement = 16 << 20

func openMemoryFiles(dir, meminfo string) memoryFiles {
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
	if m.usage != nil && meminfo != "" {
		if f, err := os.Open(meminfo); err == nil {
			before, _ := preadUint(m.usage)
			used, ok := preadMeminfoUsed(f)
			after, _ := preadUint(m.usage)
			if ok && used+meminfoAgreement >= min(before, after) && used <= max(before, after)+meminfoAgreement {
				m.meminfo = f
			} else {
				f.Close()
			}
		}
	}
	return m
}

func (m memoryFiles) close() {
	stdio.CloseAll(m.usage, m.limit, m.meminfo)
}

// read returns the sandbox's memory usage: from the cgroup if exact (or
// without /proc/meminfo), else from /proc/meminfo.
func (m memoryFiles) read(exact bool) (uint64, bool) {
	if exact || m.meminfo == nil {
		return preadUint(m.usage)
	}
	return preadMeminfoUsed(m.meminfo)
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
		var (
			lastExact time.Time // the last read of the cgroup's usage
			prev      uint64    // usage at the last look, at prevAt
			prevAt    time.Time
		)
		for {
			select {
			case <-done:
				return
			case <-t.C:
				now := time.Now()
				exact := now.Sub(lastExact) >= memoryPoll
				u, ok := s.memory.read(exact)
				if !ok {
					t.Reset(memoryPoll)
					continue
				}
				if exact {
					lastExact = now
				}
				var elapsed time.Duration
				if !prevAt.IsZero() {
					elapsed = now.Sub(prevAt)
				}
				t.Reset(memoryPollAfter(u, threshold, u-min(prev, u), elapsed))
				prev, prevAt = u, now
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

// preadMeminfoUsed reads /proc/meminfo from its start, in one system call,
// and returns its MemTotal less its MemFree, in bytes.
func preadMeminfoUsed(f *os.File) (uint64, bool) {
	var buf [512]byte
	b, err := rawfile.Pread(int(f.Fd()), buf[:])
	if err != nil {
		return 0, false
	}
	return meminfoUsed(b)
}

// meminfoUsed parses the MemTotal and MemFree lines of /proc/meminfo (in
// kB) and returns their difference in bytes.
func meminfoUsed(b []byte) (uint64, bool) {
	var total, free uint64
	var seen int
	for line := range bytes.Lines(b) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *uint64
		switch string(k) {
		case "MemTotal":
			dst = &total
		case "MemFree":
			dst = &free
		default:
			continue
		}
		f := bytes.Fields(v)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, false
		}
		n, err := strconv.ParseUint(string(f[0]), 10, 64)
		if err != nil || n > 1<<53 {
			return 0, false
		}
		*dst = n << 10
		if seen++; seen == 2 {
			return total - min(free, total), true
		}
	}
	return 0, false
}
