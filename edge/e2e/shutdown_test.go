package e2e

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// TestShutdownLeavesNoSandbox stops a stack with SIGTERM and looks for any
// container its agent made.
func TestShutdownLeavesNoSandbox(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	s, err := StartStack("e2e-shutdown", "--min-active", "2")
	if err != nil {
		t.Fatal(err)
	}
	name := s.AgentName
	// The pool fills in the background: wait for a sandbox to exist, or the
	// test would prove nothing.
	testkit.Eventually(t, time.Minute, func() error {
		if countSandboxes(t, name) == 0 {
			return fmt.Errorf("agent %s made no sandbox\n%s", name, s.Logs())
		}
		return nil
	})
	for _, p := range []*Process{s.Edge, s.ControlPlane, s.Agent} {
		if err := p.Stop(30 * time.Second); err != nil {
			t.Errorf("stop %s: %v", p.Name, err)
		}
	}
	if n := countSandboxes(t, name); n != 0 {
		t.Fatalf("%d codemode containers of agent %s remain after SIGTERM\n%s", n, name, s.Logs())
	}
}

func countSandboxes(t *testing.T, agent string) int {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "docker", "ps", "-aq", "--filter", "label=codemode.sandbox=1",
		"--filter", "label=codemode.agent="+agent).Output()
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	return len(strings.Fields(string(out)))
}
