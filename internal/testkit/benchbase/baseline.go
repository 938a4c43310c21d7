// Package benchbase measures the baselines the benchmark commands compare
// codemode with, in the same run: `docker exec` of an interpreter into a
// warm runsc container, and interpreter starts inside that container. It
// also summarises latencies as percentiles.
//
// # Lifecycle
//
// Fill in a [Baseline], [Baseline.Start] it, measure, and
// [Baseline.Remove] it. A Baseline is not safe for concurrent use.
//
// # Errors
//
// Errors of the Docker Engine API are returned as they come; a command
// that exits non-zero in the container is an error carrying its standard
// error.
package benchbase

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/codemode-go/codemode/internal/cpuset"
	"github.com/codemode-go/codemode/internal/limits"
)

// Baseline is one container from the sandbox image, with a long sleep as
// its entry process, no network, a read-only root, a small /tmp and
// 512 MiB of memory: what the agent's sandboxes are, without the agent.
type Baseline struct {
	// Docker is the engine the container runs on.
	Docker *client.Client
	// Image is the sandbox image, and Runtime the container runtime
	// (runsc).
	Image, Runtime string
	// CPUs limits the container's CPU; 0 means no limit.
	CPUs float64
	// Pin pins the container to CPUs as the agent pins a sandbox of the
	// same limit (see package cpuset): to the first set, if the host has
	// more than one.
	Pin bool
	// Labels label the container, so that what a crashed run left behind
	// can be found.
	Labels map[string]string

	// ID is the container's id once Start has created it; empty after
	// Remove.
	ID string
}

// Start creates and starts the container.
func (b *Baseline) Start(ctx context.Context) error {
	if b.ID != "" {
		return errors.New("start baseline: already started")
	}
	res := container.Resources{Memory: limits.DefaultMemoryBytes, NanoCPUs: int64(b.CPUs * 1e9)}
	if b.Pin {
		cpus, err := cpuset.Host()
		if err != nil {
			return err
		}
		if sets := cpuset.Split(cpus, b.CPUs); sets != nil {
			info, err := b.Docker.Info(ctx)
			if err != nil {
				return fmt.Errorf("read the Docker Engine's cgroup set-up: %w", err)
			}
			if err := cpuset.PrepareEngine(info.CgroupVersion, info.CgroupDriver); err != nil {
				return err
			}
			res.CpusetCpus = sets[0]
		}
	}
	created, err := b.Docker.ContainerCreate(ctx,
		&container.Config{Image: b.Image, Entrypoint: []string{"sleep", "3600"}, Labels: b.Labels},
		&container.HostConfig{Runtime: b.Runtime, NetworkMode: "none", ReadonlyRootfs: true,
			Tmpfs: map[string]string{"/tmp": "size=16m"}, Resources: res},
		nil, nil, "")
	if err != nil {
		return fmt.Errorf("create baseline container: %w", err)
	}
	b.ID = created.ID
	if err := b.Docker.ContainerStart(ctx, created.ID, container.StartOptions{}); err != nil {
		return fmt.Errorf("start baseline container: %w", err)
	}
	return nil
}

// Exec runs argv in the container through the Engine API and returns its
// standard output.
func (b *Baseline) Exec(ctx context.Context, argv ...string) (string, error) {
	ex, err := b.Docker.ContainerExecCreate(ctx, b.ID, container.ExecOptions{Cmd: argv, AttachStdout: true, AttachStderr: true})
	if err != nil {
		return "", err
	}
	hj, err := b.Docker.ContainerExecAttach(ctx, ex.ID, container.ExecAttachOptions{})
	if err != nil {
		return "", err
	}
	defer hj.Close()
	var out, errb strings.Builder
	if _, err := stdcopy.StdCopy(&out, &errb, hj.Reader); err != nil {
		return "", err
	}
	info, err := b.Docker.ContainerExecInspect(ctx, ex.ID)
	if err != nil {
		return "", err
	}
	if info.ExitCode != 0 {
		return "", fmt.Errorf("%q exited %d: %s", argv, info.ExitCode, errb.String())
	}
	return out.String(), nil
}

// ExecLatency times n runs, one after another, of `docker exec python3 -c
// 'print(1)'` (through the Engine API), after one warm-up. It returns the
// latency of each run, and the wall time of the n.
func (b *Baseline) ExecLatency(ctx context.Context, n int) (lat []time.Duration, elapsed time.Duration, err error) {
	if _, err := b.Exec(ctx, "python3", "-c", "print(1)"); err != nil {
		return nil, 0, err
	}
	t0 := time.Now()
	for range n {
		s := time.Now()
		out, err := b.Exec(ctx, "python3", "-c", "print(1)")
		if err != nil {
			return nil, 0, err
		}
		if out != "1\n" {
			return nil, 0, fmt.Errorf("docker exec printed %q", out)
		}
		lat = append(lat, time.Since(s))
	}
	return lat, time.Since(t0), nil
}

// StartLoop times loops of n starts of `python3 -c 'print(1)'` inside the
// container, run in parallel after one loop as a warm-up. It returns the
// wall time of all loops divided by n: with loops=1 the time of one start.
func (b *Baseline) StartLoop(ctx context.Context, loops, n int) (time.Duration, error) {
	script := fmt.Sprintf(`one() { for i in $(seq 1 %d); do python3 -c 'print(1)' >/dev/null; done; }
one # warm-up
s=$(date +%%s%%N)
for j in $(seq 1 %d); do one & done; wait
e=$(date +%%s%%N)
echo $(( (e - s) / %d ))`, n, loops, n)
	out, err := b.Exec(ctx, "sh", "-c", script)
	if err != nil {
		return 0, err
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("loop printed %q", out)
	}
	return time.Duration(ns), nil
}

// Remove removes the container, if Start created one.
func (b *Baseline) Remove(ctx context.Context) error {
	if b.ID == "" {
		return nil
	}
	if err := b.Docker.ContainerRemove(ctx, b.ID, container.RemoveOptions{Force: true}); err != nil {
		return fmt.Errorf("remove baseline container: %w", err)
	}
	b.ID = ""
	return nil
}
