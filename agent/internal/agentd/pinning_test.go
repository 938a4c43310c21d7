package agentd

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/codemode-go/codemode/agent/internal/sandbox"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/cpuset"
)

// TestSandboxesPinnedToCPUs: on a host of two CPUs or more, every sandbox
// of the agent (a CPU limit of 1) is pinned to one of the host's CPUs, and
// a program in it sees the one CPU it may use.
func TestSandboxesPinnedToCPUs(t *testing.T) {
	t.Parallel()
	cpus, err := cpuset.Host()
	if err != nil {
		t.Fatal(err)
	}
	sets := cpuset.Split(cpus, 1)
	if sets == nil {
		t.Skipf("the host has %d CPU: nothing to pin", len(cpus))
	}
	a := shared(t)
	a.waitWarm(t, 1)
	res := a.exec(t, &executionv1.Execution{Language: "python", Code: `import os; print(os.cpu_count(), len(os.sched_getaffinity(0)))`})
	if res.GetExitCode() != 0 || res.GetStdout() != "1 1\n" {
		t.Errorf("CPUs a program sees: %q (stderr %q), want 1 1", res.GetStdout(), res.GetStderr())
	}
	res = a.exec(t, &executionv1.Execution{Language: "bash", Code: `nproc`})
	if res.GetStdout() != "1\n" {
		t.Errorf("nproc: %q (stderr %q), want 1", res.GetStdout(), res.GetStderr())
	}

	ctx := t.Context()
	list, err := a.Driver().Client().ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", sandbox.LabelAgent+"="+a.cfg.Name))})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list {
		info, err := a.Driver().Client().ContainerInspect(ctx, c.ID)
		if err != nil {
			continue // removed meanwhile
		}
		if got := info.HostConfig.CpusetCpus; !slices.Contains(sets, got) {
			t.Errorf("container %s is pinned to CPUs %q, want one of %s", c.ID[:12], got, strings.Join(sets, " "))
		}
		if info.State.Pid > 0 {
			// The sandbox's own process (runsc's) runs on its CPUs only.
			if got, want := affinity(t, info.State.Pid), info.HostConfig.CpusetCpus; got != "" && got != want {
				t.Errorf("container %s: its process %d may run on CPUs %s, want %s", c.ID[:12], info.State.Pid, got, want)
			}
		}
	}
}

// affinity is the list of CPUs process pid may run on, as /proc says
// ("" if it is gone).
func affinity(t *testing.T, pid int) string {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no Cpus_allowed_list in /proc/%d/status", pid)
	return ""
}
