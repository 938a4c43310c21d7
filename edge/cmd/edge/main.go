// Command edge is codemode's public door: the Connect API, MCP and the web
// playground on one port. See --help. `edge policy` checks, runs and
// benchmarks a policy module with the edge's own policy engine.
package main

import (
	"context"
	"io"

	"github.com/codemode-go/codemode/edge/internal/edged"
	"github.com/codemode-go/codemode/edge/internal/policytool"
	"github.com/codemode-go/codemode/internal/cli"
)

func main() { cli.Main(run) }

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == policytool.Command {
		return policytool.Run(ctx, args[1:], stdin, stdout, stderr)
	}
	return edged.Run(ctx, args, stdin, stdout, stderr)
}
