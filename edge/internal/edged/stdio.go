package edged

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/codemode-go/codemode/edge/internal/mcpserver"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/cluster"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/version"
)

// StdioCommand is the first argument that selects RunStdio.
const StdioCommand = "mcp-stdio"

// RunStdio serves MCP over stdin and stdout, for desktop clients that
// launch a server as a subprocess, and forwards every tool call to an edge
// over its Connect API with the caller's API key. The tools and their
// results are those of the edge's /mcp (or /mcp-no-code-execute with
// --no-code-execute), except the declared API tools, which only the edge's
// HTTP door serves (edge/RATIONALE.md). Logs go to stderr: stdout carries
// the protocol.
func RunStdio(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := cli.NewFlags("edge "+StdioCommand, stderr)
	edgeURL := fs.String("url", "http://127.0.0.1:8000", "the edge's base URL")
	fs.Env("url", "CODEMODE_URL")
	key := fs.String("api-key", "", "API key sent to the edge; prefer the environment variable, which other users cannot see in the process list")
	fs.Env("api-key", "CODEMODE_API_KEY")
	noCode := fs.Bool("no-code-execute", false, "offer the tools of /mcp-no-code-execute, none of which runs code (the declared API tools are served by the edge's /mcp-no-code-execute only)")
	logFormat, logLevel := cli.LogFlags(fs)
	if err := fs.Parse(args, os.Getenv); err != nil {
		return err
	}
	logger, err := cli.NewLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		return err
	}
	hc, base, err := server.NewEdgeClient(*edgeURL)
	if err != nil {
		return err
	}
	if *key != "" {
		hc = cluster.WithBearer(hc, *key)
	}
	client := edgev1connect.NewExecutionServiceClient(hc, base)
	servers := mcpserver.New(mcpserver.Config{Open: mcpserver.Remote(client), Logger: logger.With("component", "mcp-stdio"), Version: version.Version()})
	srv := servers.Server(ctx, nil, !*noCode)
	t := &mcp.IOTransport{Reader: io.NopCloser(stdin), Writer: nopWriteCloser{stdout}}
	err = srv.Run(ctx, t)
	if errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
