package benchbase

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// cgroupV2 is where the Docker Engine puts its containers' cgroups under
// cgroup v2 with the cgroupfs driver (v1: one hierarchy per controller,
// each with a docker directory).
const cgroupV2 = "/sys/fs/cgroup/docker/"

// ContainerCPU reads the CPU time container id has used so far from its
// cgroup; false when it cannot be read. Under runsc that is the sandbox's
// kernel and everything it runs.
func ContainerCPU(id string) (time.Duration, bool) {
	if ns, ok := readInt("/sys/fs/cgroup/cpuacct/docker/" + id + "/cpuacct.usage"); ok {
		return time.Duration(ns), true
	}
	b, err := os.ReadFile(cgroupV2 + id + "/cpu.stat")
	if err != nil {
		return 0, false
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "usage_usec "); ok {
			us, err := strconv.ParseInt(v, 10, 64)
			return time.Duration(us) * time.Microsecond, err == nil
		}
	}
	return 0, false
}

// ContainersCPU reads the CPU time of every container so far, from their
// parent cgroup (v1), which keeps what a container used after it is
// removed; false when it cannot be read.
func ContainersCPU() (time.Duration, bool) {
	ns, ok := readInt("/sys/fs/cgroup/cpuacct/docker/cpuacct.usage")
	return time.Duration(ns), ok
}

// ContainerMemory reads container id's memory use from its cgroup, what
// its memory limit applies to; 0 when it cannot be read.
func ContainerMemory(id string) int64 {
	if n, ok := readInt("/sys/fs/cgroup/memory/docker/" + id + "/memory.usage_in_bytes"); ok {
		return n
	}
	n, _ := readInt(cgroupV2 + id + "/memory.current")
	return n
}

func readInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}
