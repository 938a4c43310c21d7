package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"
)

// baselines measures, in one warm runsc container from the agent's image,
// what the agent is compared with: docker exec of an interpreter, and
// interpreter starts inside the sandbox in one loop and in four.
func (b *bench) baselines(ctx context.Context, r *report) error {
	b.logf("starting the baseline container")
	if err := b.startBaseline(ctx); err != nil {
		return err
	}
	b.logf("docker exec baseline")
	lat, err := b.dockerExec(ctx, b.o.execN)
	if err != nil {
		return err
	}
	r.exec = runs{lat: lat}
	b.logf("python start inside the sandbox")
	if r.start1, err = b.inSandboxLoop(ctx, 1); err != nil {
		return err
	}
	r.start4, err = b.inSandboxLoop(ctx, 4)
	return err
}

// startBaseline starts a runsc container from the same image with a
// long sleep as its entry process, without a CPU limit.
func (b *bench) startBaseline(ctx context.Context) error {
	created, err := b.docker.ContainerCreate(ctx,
		&container.Config{Image: b.o.image, Entrypoint: []string{"sleep", "3600"}, Labels: map[string]string{"codemode.bench": "1"}},
		&container.HostConfig{Runtime: b.o.runtime, NetworkMode: "none", ReadonlyRootfs: true,
			Tmpfs: map[string]string{"/tmp": "size=16m"}, Resources: container.Resources{Memory: 512 << 20, NanoCPUs: int64(b.o.cpus * 1e9)}},
		nil, nil, "")
	if err != nil {
		return err
	}
	b.baseline = created.ID
	return b.docker.ContainerStart(ctx, created.ID, container.StartOptions{})
}

// execIn runs argv in the baseline container through the Engine API and
// returns its stdout.
func (b *bench) execIn(ctx context.Context, argv ...string) (string, error) {
	ex, err := b.docker.ContainerExecCreate(ctx, b.baseline, container.ExecOptions{Cmd: argv, AttachStdout: true, AttachStderr: true})
	if err != nil {
		return "", err
	}
	hj, err := b.docker.ContainerExecAttach(ctx, ex.ID, container.ExecAttachOptions{})
	if err != nil {
		return "", err
	}
	defer hj.Close()
	var out, errb strings.Builder
	if _, err := stdcopy.StdCopy(&out, &errb, hj.Reader); err != nil {
		return "", err
	}
	info, err := b.docker.ContainerExecInspect(ctx, ex.ID)
	if err != nil {
		return "", err
	}
	if info.ExitCode != 0 {
		return "", fmt.Errorf("%q exited %d: %s", argv, info.ExitCode, errb.String())
	}
	return out.String(), nil
}

// dockerExec times n runs of python3 -c 'print(1)' by docker exec in the
// baseline container, after a warm-up.
func (b *bench) dockerExec(ctx context.Context, n int) ([]time.Duration, error) {
	if _, err := b.execIn(ctx, "python3", "-c", "print(1)"); err != nil { // warm-up
		return nil, err
	}
	var lat []time.Duration
	for range n {
		t0 := time.Now()
		out, err := b.execIn(ctx, "python3", "-c", "print(1)")
		if err != nil {
			return nil, err
		}
		if out != "1\n" {
			return nil, fmt.Errorf("docker exec printed %q", out)
		}
		lat = append(lat, time.Since(t0))
	}
	return lat, nil
}

// inSandboxLoop times loops of `python3 -c 'print(1)'` inside the baseline
// sandbox: with loops=1 it returns the time of one start, otherwise the time
// all loops take divided by the starts of one loop.
func (b *bench) inSandboxLoop(ctx context.Context, loops int) (time.Duration, error) {
	script := fmt.Sprintf(`one() { for i in $(seq 1 %d); do python3 -c 'print(1)' >/dev/null; done; }
one # warm-up
s=$(date +%%s%%N)
for j in $(seq 1 %d); do one & done; wait
e=$(date +%%s%%N)
echo $(( (e - s) / %d ))`, b.o.loopN, loops, b.o.loopN)
	out, err := b.execIn(ctx, "sh", "-c", script)
	if err != nil {
		return 0, err
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("loop printed %q", out)
	}
	return time.Duration(ns), nil
}
