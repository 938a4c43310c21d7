package main

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	"github.com/codemode-go/codemode/internal/testkit/launch"
)

// agentWarm returns agent's warm sandboxes; 0 when it does not answer.
func (b *bench) agentWarm(ctx context.Context, agent *launch.Process) int {
	c := agentv1connect.NewAgentServiceClient(b.authClient(b.secret), agent.URL())
	st, err := c.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
	if err != nil {
		return 0
	}
	return int(st.Msg.GetStatus().GetWarm())
}

// baselineLabel marks the baseline container, and the label
// codemode.agent=NAME the agent's sandboxes; cleanup removes both.
const baselineLabel = "codemode.stackbench"

// removeContainers removes, as a backstop after the agent has stopped,
// the baseline container and any sandbox of the agent left behind.
func (b *bench) removeContainers() {
	if b.docker == nil || b.name == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, label := range []string{baselineLabel + "=" + b.name, "codemode.agent=" + b.name, "codemode.agent=" + b.name + "-" + stackPreload, "codemode.agent=" + b.name + "-" + stackFresh,
		"codemode.agent=" + b.name + "-" + stackPlain, "codemode.agent=" + b.name + "-" + stackTLS} {
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
