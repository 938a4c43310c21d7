package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The agent's systemd unit passes `systemd-analyze verify` without a
// warning, with its binaries where the unit expects them (here, built into
// a temporary directory).
func TestAgentUnitVerifies(t *testing.T) {
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Fatalf("systemd-analyze is not installed: agent/host/setup.sh installs it (package systemd): %v", err)
	}
	unit, err := os.ReadFile("../agent/host/codemode-agent.service")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-trimpath", "-o", dir+"/", "./agent/cmd/agent", "./agent/cmd/runner")
	build.Dir = ".."
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	text := strings.NewReplacer("/usr/local/bin/codemode-agent", filepath.Join(dir, "agent"),
		"/usr/local/lib/codemode/runner", filepath.Join(dir, "runner")).Replace(string(unit))
	if text == string(unit) {
		t.Fatal("the unit does not start /usr/local/bin/codemode-agent with /usr/local/lib/codemode/runner")
	}
	path := filepath.Join(dir, "codemode-agent.service")
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("systemd-analyze", "verify", path).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}
