package e2e

import (
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
)

// checkPreloaded is TestMakeUp's "preloaded": with the agent's defaults,
// what its sandboxes preload reaches callers through the whole stack
// (ListLanguages at the edge, MCP execute_code's description), and a
// stateless run through the edge that imports one of the modules is forked
// from the sandbox's preloaded parent, not started fresh.
func checkPreloaded(t *testing.T, edgeURL string) {
	c := edgev1connect.NewExecutionServiceClient(httpClient, edgeURL)
	var mods []string
	for _, l := range listLanguages(t, c) {
		if l.GetName() == "python" {
			mods = l.GetPreloaded()
		}
	}
	if !slices.Contains(mods, "pandas") || !slices.Contains(mods, "numpy") {
		t.Fatalf("python preloads %q through the edge, want the default list (numpy and pandas among it)", mods)
	}

	tools, err := mcpSession(t, edgeURL+"/mcp").ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var desc string
	for _, tool := range tools.Tools {
		if tool.Name == "execute_code" {
			desc = tool.Description
		}
	}
	for _, m := range mods {
		if !strings.Contains(desc, m) {
			t.Errorf("execute_code's description does not name the preloaded %s:\n%s", m, desc)
		}
	}

	// A forked interpreter's parent is the sandbox's preloaded parent; a
	// fresh one's is the runner, pid 1. The first run in a sandbox started
	// without a parent (none of the pool's runs had named a module yet)
	// imports for itself, and the Reset after it starts the parent.
	for range 3 {
		res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{
			Language: "python", Code: "import os, pandas\nprint(os.getppid())",
		}))
		if err != nil {
			t.Fatal(err)
		}
		r := res.Msg.GetResult()
		if r.GetExitCode() != 0 || r.GetTimedOut() {
			t.Fatalf("run importing pandas: exit %d, timed out %v, stderr %q", r.GetExitCode(), r.GetTimedOut(), r.GetStderr())
		}
		if strings.TrimSpace(r.GetStdout()) != "1" {
			return
		}
	}
	t.Errorf("three runs importing pandas through the edge ran in fresh interpreters (parent pid 1), none forked from a preloaded parent")
}
