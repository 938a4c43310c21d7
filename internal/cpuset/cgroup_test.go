package cpuset

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/codemode-go/codemode/internal/testkit/testenv"
)

// TestFillV1 fills a new two-level cgroup under the host's cpuset
// hierarchy, as the agent does for the Docker Engine's parent cgroup, and
// pins a child of it: a child of an unfilled cpuset can be given no CPUs.
func TestFillV1(t *testing.T) {
	root, err := V1Root()
	if err != nil {
		t.Skipf("no cgroup v1 cpuset hierarchy here: %v", err)
	}
	testenv.NeedRoot(t, "creating cgroups")
	read := func(dir, name string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	top := filepath.Join(root, fmt.Sprintf("codemode-test-%d", os.Getpid()))
	parent := filepath.Join(top, "parent")
	child := filepath.Join(parent, "child")
	t.Cleanup(func() {
		for _, d := range []string{child, parent, top} {
			os.Remove(d)
		}
	})
	if err := os.MkdirAll(child, 0o755); err != nil {
		t.Fatal(err)
	}
	first := strings.Split(strings.Split(read(root, "cpuset.cpus"), ",")[0], "-")[0]
	// What the first pinned container would meet: its parents empty.
	if err := os.WriteFile(filepath.Join(child, "cpuset.cpus"), []byte(first), 0o644); err == nil {
		t.Fatalf("a child of an empty cpuset took CPU %s; the kernel no longer needs the fill", first)
	}
	if err := FillV1(parent); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"cpuset.cpus", "cpuset.mems"} {
		for _, d := range []string{top, parent} {
			if got, want := read(d, name), read(root, name); got != want {
				t.Errorf("%s of %s = %q, want the root's %q", name, d, got, want)
			}
		}
	}
	if err := os.WriteFile(filepath.Join(child, "cpuset.cpus"), []byte(first), 0o644); err != nil {
		t.Errorf("pin a child of the filled cgroup to CPU %s: %v", first, err)
	}
	// Filling what is already filled changes nothing.
	if err := FillV1(parent); err != nil {
		t.Fatal(err)
	}
	if got := read(child, "cpuset.cpus"); got != first {
		t.Errorf("child's CPUs after a second fill = %q, want %q", got, first)
	}
}

func TestV1RootIsCpuset(t *testing.T) {
	root, err := V1Root()
	if err != nil {
		t.Skipf("no cgroup v1 cpuset hierarchy here: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "cpuset.cpus")); err != nil {
		t.Errorf("V1Root() = %s, which has no cpuset.cpus: %v", root, err)
	}
}
