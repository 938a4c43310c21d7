package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/pkg/stdcopy"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
)

// agentWarm returns the agent's warm sandboxes; 0 when it does not answer.
func (b *bench) agentWarm(ctx context.Context) int {
	c := agentv1connect.NewAgentServiceClient(b.authClient(b.secret), b.agent.URL())
	st, err := c.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
	if err != nil {
		return 0
	}
	return int(st.Msg.GetStatus().GetWarm())
}

// baselineLabel marks the baseline container, and the label
// codemode.agent=NAME the agent's sandboxes; cleanup removes both.
const baselineLabel = "codemode.stackbench"

// startBaseline starts a runsc container from the sandbox image with a long
// sleep as its entry process, with the agent's default CPU and memory
// limits (1 CPU, 512 MiB).
func (b *bench) startBaseline(ctx context.Context) error {
	created, err := b.docker.ContainerCreate(ctx,
		&container.Config{Image: b.o.image, Entrypoint: []string{"sleep", "3600"}, Labels: map[string]string{baselineLabel: b.name}},
		&container.HostConfig{Runtime: b.o.runtime, NetworkMode: "none", ReadonlyRootfs: true,
			Tmpfs: map[string]string{"/tmp": "size=16m"}, Resources: container.Resources{Memory: 512 << 20, NanoCPUs: 1e9}},
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

// dockerExec times n runs of `docker exec python3 -c 'print(1)'` (through
// the Engine API) after one warm-up.
func (b *bench) dockerExec(ctx context.Context, n int) ([]sample, time.Duration, error) {
	if _, err := b.execIn(ctx, "python3", "-c", "print(1)"); err != nil {
		return nil, 0, err
	}
	var samples []sample
	t0 := time.Now()
	for range n {
		s := time.Now()
		out, err := b.execIn(ctx, "python3", "-c", "print(1)")
		if err != nil {
			return nil, 0, err
		}
		if out != "1\n" {
			return nil, 0, fmt.Errorf("docker exec printed %q", out)
		}
		samples = append(samples, sample{kind: jobPrint.kind, d: time.Since(s)})
	}
	return samples, time.Since(t0), nil
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

// removeContainers removes, as a backstop after the agent has stopped,
// the baseline container and any sandbox of the agent left behind.
func (b *bench) removeContainers() {
	if b.docker == nil || b.name == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, label := range []string{baselineLabel + "=" + b.name, "codemode.agent=" + b.name} {
		list, err := b.docker.ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", label))})
		if err != nil {
			fmt.Fprintf(b.log, "stackbench: list containers: %v\n", err)
			continue
		}
		for _, c := range list {
			if err := b.docker.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true}); err != nil {
				fmt.Fprintf(b.log, "stackbench: remove container %s: %v\n", c.ID[:12], err)
			}
		}
	}
}
