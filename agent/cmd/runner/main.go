// Command runner is the entry process of every codemode sandbox: it takes
// framed requests on stdin and answers with framed events on stdout (see
// package agent/internal/runner). Build it static (CGO_ENABLED=0): it runs
// inside the sandbox image, bind-mounted at wire.RunnerPath.
package main

import (
	"github.com/codemode-go/codemode/agent/internal/runner"
	"github.com/codemode-go/codemode/internal/cli"
)

func main() { cli.Main(runner.Run) }
