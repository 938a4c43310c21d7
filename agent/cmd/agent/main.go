// Command agent serves codemode.agent.v1.AgentService on one port (gRPC,
// gRPC-Web and Connect) and runs code in gVisor sandboxes through the Docker
// Engine. Run it with --help for its flags; each also reads an environment
// variable (the seed's WORKER_PORT, DOCKER_IMAGE_NAME and MIN_ACTIVE among
// them). It expects the static runner binary next to itself (see --runner).
package main

import (
	"github.com/codemode-go/codemode/agent/internal/agentd"
	"github.com/codemode-go/codemode/internal/cli"
)

func main() { cli.Main(agentd.Run) }
