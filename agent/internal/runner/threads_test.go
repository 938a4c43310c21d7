package runner

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
)

func TestThreadEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		quota, period string // "": no such file
		reported      int
		want          []string
	}{
		{"a quota below the reported CPUs", "100000", "100000", 2, []string{"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"}},
		{"a part of a CPU rounds up", "150000", "100000", 4, []string{"OPENBLAS_NUM_THREADS=2", "OMP_NUM_THREADS=2"}},
		{"pinned: as many reported as allowed", "100000", "100000", 1, nil},
		{"no quota", "-1", "100000", 2, nil},
		{"no cgroup", "", "", 2, nil},
	} {
		dir := t.TempDir()
		for name, v := range map[string]string{"cpu.cfs_quota_us": tc.quota, "cpu.cfs_period_us": tc.period} {
			if v != "" {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(v+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		if got := threadEnv(dir, tc.reported); !slices.Equal(got, tc.want) {
			t.Errorf("%s: threadEnv = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestNumericalThreadsWithinQuota runs numpy in a sandbox of one CPU that
// is not pinned (startSandbox: --cpus=1, no CPU set): it reports the
// host's CPUs, and OpenBLAS, which would start a thread for each, starts
// none beside the main one.
func TestNumericalThreadsWithinQuota(t *testing.T) {
	t.Parallel()
	sb := startSandbox(t)
	r := sb.mustRun(t, "python", "import os, numpy\nprint(os.cpu_count(), len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS'))")
	want := fmt.Sprintf("%d 1 1\n", runtime.NumCPU())
	if runtime.NumCPU() == 1 {
		want = "1 1 None\n"
	}
	if r.stdout != want {
		t.Fatalf("CPUs reported, threads after import numpy, OPENBLAS_NUM_THREADS: %q (stderr %q), want %q", r.stdout, r.stderr, want)
	}
}
