// Command edge is codemode's public door: the Connect API, MCP and the web
// playground on one port. See --help.
package main

import (
	"github.com/codemode-go/codemode/edge/internal/edged"
	"github.com/codemode-go/codemode/internal/cli"
)

func main() { cli.Main(edged.Run) }
