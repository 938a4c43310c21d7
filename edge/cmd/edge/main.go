// Command edge is codemode's public door: the Connect API, MCP and the web
// playground on one port. `edge mcp-stdio` serves MCP over stdio, and `edge
// policy` checks, runs and benchmarks a policy module with the edge's own
// policy engine. See --help.
package main

import (
	"github.com/codemode-go/codemode/edge/internal/edged"
	"github.com/codemode-go/codemode/internal/cli"
)

func main() { cli.Main(edged.Run) }
