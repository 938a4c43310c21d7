// Package deploy holds what operators deploy codemode with: the release
// archives (dist.sh, `make dist`).
package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// `make dist` twice gives the same archive, byte for byte, and every binary
// in it answers --version with the version it was given.
func TestDistIsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the four binaries twice")
	}
	const version = "v0.0.0-disttest"
	sums := make([]string, 2)
	dirs := make([]string, 2)
	for i := range sums {
		dirs[i] = filepath.Join(t.TempDir(), "dist")
		cmd := exec.Command("bash", "dist.sh")
		cmd.Env = append(os.Environ(), "VERSION="+version, "DIST="+dirs[i], "DIST_PLATFORMS=linux/amd64")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("dist.sh: %v\n%s", err, out)
		}
		b, err := os.ReadFile(filepath.Join(dirs[i], "SHA256SUMS"))
		if err != nil {
			t.Fatal(err)
		}
		sums[i] = string(b)
	}
	if sums[0] != sums[1] {
		t.Errorf("two builds of the same tree differ:\n%s\n%s", sums[0], sums[1])
	}
	name := "codemode-" + version + "-linux-amd64"
	if !strings.Contains(sums[0], name+".tar.gz") {
		t.Fatalf("SHA256SUMS does not list %s.tar.gz:\n%s", name, sums[0])
	}
	x := t.TempDir()
	if out, err := exec.Command("tar", "-xzf", filepath.Join(dirs[0], name+".tar.gz"), "-C", x).CombinedOutput(); err != nil {
		t.Fatalf("extract: %v\n%s", err, out)
	}
	for _, bin := range []string{"edge", "controlplane", "agent", "runner"} {
		out, err := exec.Command(filepath.Join(x, name, bin), "--version").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), bin+" "+version+" (commit ") {
			t.Errorf("%s --version: %q %v, want %q...", bin, out, err, bin+" "+version+" (commit ")
		}
	}
}
