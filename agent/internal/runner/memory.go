package runner

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// memoryPoll is how often the memory watchdog looks at the sandbox's usage
// while a run is going.
const memoryPoll = 10 * time.Millisecond

// memoryHeadroom is what the watchdog keeps free below the sandbox's memory
// limit. Under gVisor the host's OOM killer kills the whole sandbox (runner
// included) when the limit is reached, so the runner kills the run a little
// before that, and the sandbox survives to report it. The sandbox kernel's
// own overhead counts against the host limit but not in the usage gVisor
// reports, hence the margin.
func memoryHeadroom(limit uint64) uint64 {
	return max(limit/8, 24<<20)
}

// watchMemory returns a channel that is closed if the sandbox's memory usage
// comes within memoryHeadroom of its limit, or reaches runLimit (if not 0),
// before done is closed. Without a readable memory cgroup, or without any
// limit, it returns nil (never ready).
func (s *server) watchMemory(done <-chan struct{}, runLimit uint64) <-chan struct{} {
	if s.cfg.cgroupMemory == "" {
		return nil
	}
	usageFile := filepath.Join(s.cfg.cgroupMemory, "memory.usage_in_bytes")
	if _, ok := readUint(usageFile); !ok {
		return nil
	}
	threshold := uint64(1<<64 - 1)
	limit, ok := readUint(filepath.Join(s.cfg.cgroupMemory, "memory.limit_in_bytes"))
	if ok && limit > 0 && limit < 1<<62 {
		threshold = limit - min(limit, memoryHeadroom(limit))
	}
	if runLimit > 0 {
		threshold = min(threshold, runLimit)
	}
	if threshold == 1<<64-1 {
		return nil
	}
	fired := make(chan struct{})
	go func() {
		t := time.NewTicker(memoryPoll)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if u, ok := readUint(usageFile); ok && u >= threshold {
					s.cfg.log.Warn("memory limit reached: killing the run", "usage", u, "threshold", threshold)
					close(fired)
					return
				}
			}
		}
	}()
	return fired
}

func readUint(path string) (uint64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil
}
