// Command controlplane routes runs to agents. See --help.
package main

import (
	"github.com/codemode-go/codemode/controlplane/internal/controlplaned"
	"github.com/codemode-go/codemode/internal/cli"
)

func main() { cli.Main(controlplaned.Run) }
