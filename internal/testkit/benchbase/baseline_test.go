package benchbase

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/codemode-go/codemode/internal/cpuset"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

func TestBaseline(t *testing.T) {
	t.Parallel()
	dc := dockertest.Client(t)
	label := "codemode.benchbase.test"
	b := &Baseline{Docker: dc, Image: dockertest.Image(), Runtime: "runsc", CPUs: 1, Pin: true, Labels: map[string]string{label: t.Name()}}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := b.Remove(ctx); err != nil {
			t.Error(err)
		}
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	list, err := dc.ContainerList(ctx, container.ListOptions{Filters: filters.NewArgs(filters.Arg("label", label+"="+t.Name()))})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != b.ID {
		t.Fatalf("containers labelled %s: %v, want the baseline %s", label, list, b.ID)
	}

	out, err := b.Exec(ctx, "echo", "hi")
	if err != nil || out != "hi\n" {
		t.Fatalf("Exec(echo hi) = %q, %v; want \"hi\\n\"", out, err)
	}
	// Pinned as the agent pins a sandbox of one CPU: it sees one CPU.
	cpus, err := cpuset.Host()
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d\n", len(cpus))
	if cpuset.Split(cpus, 1) != nil {
		want = "1\n"
	}
	if out, err := b.Exec(ctx, "nproc"); err != nil || out != want {
		t.Errorf("nproc in the baseline = %q, %v; want %q", out, err, want)
	}
	if _, err := b.Exec(ctx, "sh", "-c", "echo oops >&2; exit 3"); err == nil {
		t.Fatal("Exec of a failing command returned no error")
	}
	d, err := b.StartLoop(ctx, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if d <= 0 {
		t.Fatalf("StartLoop(1, 2) = %v, want a positive duration", d)
	}
	// Its cgroup has counted the commands' CPU and holds memory; every
	// container's count holds its own.
	used, ok := ContainerCPU(b.ID)
	all, allOK := ContainersCPU()
	if !ok || used <= 0 || !allOK || all < used {
		t.Errorf("ContainerCPU = %v, %v; ContainersCPU = %v, %v: want a positive time within all containers'", used, ok, all, allOK)
	}
	if m := ContainerMemory(b.ID); m <= 0 {
		t.Errorf("ContainerMemory = %d, want some", m)
	}
	if _, ok := ContainerCPU("no-such-container"); ok {
		t.Error("ContainerCPU of no container reads a time")
	}
}
