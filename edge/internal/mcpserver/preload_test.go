package mcpserver

import (
	"strings"
	"testing"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// TestSandboxTextPreloaded: execute_code's description says which modules a
// run finds already imported, when the agents report any.
func TestSandboxTextPreloaded(t *testing.T) {
	info := &edgev1.ListLanguagesResponse{Languages: []*executionv1.Language{
		{Name: "python", Preloaded: []string{"numpy", "pandas"}},
		{Name: "bash"},
	}}
	if got := sandboxText(info, network{}); !strings.Contains(got, "Already imported when a run starts, so importing them costs nothing (python: numpy, pandas)") {
		t.Errorf("description lacks the preloaded modules:\n%s", got)
	}
	info.Languages[0].Preloaded = nil
	if got := sandboxText(info, network{}); strings.Contains(got, "Already imported") {
		t.Errorf("description claims preloaded modules without any:\n%s", got)
	}
}
