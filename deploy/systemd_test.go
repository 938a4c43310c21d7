package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/codemode-go/codemode/internal/hugepages"
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

// The host's transparent huge pages are as agent/host/setup.sh (step 2b)
// leaves them: a shmem_enabled under which runsc backs sandbox memory with
// huge pages and commits it by fallocate(2) (always, within_size or force;
// not advise, under which a write past the sandbox's limit takes the whole
// sandbox); and the tmpfiles.d file it installs with the agent writes that
// setting at boot. With CODEMODE_HOST_HUGEPAGES=0 setup.sh leaves the host
// alone, and so does this test; deny is an operator's word it keeps.
func TestHostHugePages(t *testing.T) {
	script, err := os.ReadFile("../agent/host/setup.sh")
	if err != nil {
		t.Fatal(err)
	}
	line := "w $THP/shmem_enabled - - - - $(thp shmem_enabled)\n"
	if !strings.Contains(string(script), line) {
		t.Errorf("setup.sh's tmpfiles.d file lacks %q", line)
	}
	if os.Getenv("CODEMODE_HOST_HUGEPAGES") == "0" {
		t.Skip("with CODEMODE_HOST_HUGEPAGES=0 setup.sh leaves the host's huge pages as they are")
	}
	if _, err := os.Stat(filepath.Join(hugepages.Dir, "shmem_enabled")); err != nil {
		t.Skipf("no transparent huge pages here: %v", err)
	}
	switch hp := hugepages.Host(); {
	case hp.ShmemEnabled == "deny":
		t.Skip("shmem_enabled deny: the host's operator keeps huge pages from shared memory")
	case !hp.Sandboxes() || hp.WriteCommitted():
		t.Errorf("%v: runsc gives sandboxes no huge pages, or commits their memory by writing it (run agent/host/setup.sh)", hp)
	}
}
