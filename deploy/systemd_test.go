package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/codemode-go/codemode/internal/testkit/benchbase"
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

// With CODEMODE_HOST_HUGEPAGES=1 the host's transparent huge pages are as
// agent/host/setup.sh (step 2b) leaves them: settings under which runsc
// backs sandbox memory with huge pages (shmem_enabled always, within_size or
// force; or advise with a defrag of always, defer or never); and the
// tmpfiles.d file it installs with the agent writes both settings at boot.
// Without it (the default) setup.sh leaves the host alone, and so does this
// test.
func TestHostHugePages(t *testing.T) {
	script, err := os.ReadFile("../agent/host/setup.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"shmem_enabled", "defrag"} {
		line := "w $THP/" + name + " - - - - $(thp " + name + ")\n"
		if !strings.Contains(string(script), line) {
			t.Errorf("setup.sh's tmpfiles.d file lacks %q", line)
		}
	}
	if os.Getenv("CODEMODE_HOST_HUGEPAGES") != "1" {
		t.Skip("without CODEMODE_HOST_HUGEPAGES=1 setup.sh leaves the host's huge pages as they are")
	}
	if _, err := os.Stat("/sys/kernel/mm/transparent_hugepage"); err != nil {
		t.Skipf("no transparent huge pages here: %v", err)
	}
	shmem, defrag := benchbase.HugePageSetting("shmem_enabled"), benchbase.HugePageSetting("defrag")
	switch {
	case shmem == "always" || shmem == "within_size" || shmem == "force":
	case shmem == "advise" && (defrag == "always" || defrag == "defer" || defrag == "never"):
	default:
		t.Errorf("shmem_enabled %q, defrag %q: runsc gives sandboxes no huge pages (run agent/host/setup.sh)", shmem, defrag)
	}
}
