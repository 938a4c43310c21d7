package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Connect returns an MCP client session, in memory, on a new server of one
// tool set (withCode: the tools of /mcp; without: those of
// /mcp-no-code-execute) whose every tool call opens its Backend with
// header h, as a call over HTTP with that header would: the same tools,
// tenant, limits, policies and results as the HTTP doors, for a caller
// inside the edge (the chat loop). progress, if not nil, gets execute_code's
// progress notifications when a call asks for them with a progress token.
//
// Closing the session ends the server's side; a call whose context is
// cancelled is cancelled on the server (notifications/cancelled), which
// cancels its run.
func (s *Servers) Connect(ctx context.Context, h http.Header, withCode bool, progress func(context.Context, *mcp.ProgressNotificationClientRequest)) (*mcp.ClientSession, error) {
	h = h.Clone()
	open := func(ctx context.Context, _ http.Header) (Backend, string, error) { return s.cfg.Open(ctx, h) }
	srv := s.newServer(withCode)
	s.addToolsOpening(srv, s.languages(ctx, h), withCode, open)
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		return nil, fmt.Errorf("connect in-memory MCP server: %w", err)
	}
	impl := &mcp.Implementation{Name: "codemode-chat", Version: s.cfg.Version}
	cs, err := mcp.NewClient(impl, &mcp.ClientOptions{ProgressNotificationHandler: progress}).Connect(ctx, ct, nil)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("connect in-memory MCP client: %w", err), ss.Close())
	}
	return cs, nil
}
