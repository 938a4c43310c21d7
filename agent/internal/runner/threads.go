package runner

import (
	"os"
	"strconv"
	"strings"
)

// threadEnv is the environment that sizes the thread pools of numerical
// libraries (OpenBLAS, and OpenMP in whatever uses it) to the CPUs the
// sandbox's quota allows, when that is fewer than it reports: a sandbox
// that is not pinned to its own CPUs (--pin-cpus=false, or a host with
// fewer than twice its CPUs) reports the host's, and OpenBLAS then starts
// a thread per reported CPU, which the quota makes take turns (numpy's
// eigvals took 2-4x as long). A pinned sandbox reports its own CPUs, and
// gets nothing. quotaDir is the cgroup (v1) cpu directory; reported the
// CPUs the sandbox shows.
func threadEnv(quotaDir string, reported int) []string {
	n, ok := quotaCPUs(quotaDir)
	if !ok || n >= reported {
		return nil
	}
	v := strconv.Itoa(n)
	return []string{"OPENBLAS_NUM_THREADS=" + v, "OMP_NUM_THREADS=" + v}
}

// quotaCPUs reads the CPUs the cgroup in dir allows, its quota over its
// period rounded up; false without a quota.
func quotaCPUs(dir string) (int, bool) {
	read := func(name string) (int64, bool) {
		b, err := os.ReadFile(dir + "/" + name)
		if err != nil {
			return 0, false
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n, err == nil
	}
	quota, ok := read("cpu.cfs_quota_us")
	period, ok2 := read("cpu.cfs_period_us")
	if !ok || !ok2 || quota <= 0 || period <= 0 {
		return 0, false
	}
	return int((quota + period - 1) / period), true
}
