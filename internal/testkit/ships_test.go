package testkit_test

import (
	"os/exec"
	"strings"
	"testing"
)

// services are the binaries that ship: the three services and the runner
// the agent mounts into its sandboxes.
var services = []string{
	"github.com/codemode-go/codemode/agent/cmd/agent",
	"github.com/codemode-go/codemode/agent/cmd/runner",
	"github.com/codemode-go/codemode/edge/cmd/edge",
	"github.com/codemode-go/codemode/controlplane/cmd/controlplane",
}

// testKit is the tree of test and benchmark support.
const testKit = "github.com/codemode-go/codemode/internal/testkit"

// TestServicesShipNoTestKit checks that no package a service binary is
// built from is, or imports, a package of the test kit.
func TestServicesShipNoTestKit(t *testing.T) {
	for _, svc := range services {
		t.Run(svc[strings.LastIndex(svc, "/")+1:], func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, svc)
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("go list -deps %s: %v\n%s", svc, err, stderrOf(err))
			}
			n := 0
			for line := range strings.Lines(string(out)) {
				pkg, imports, _ := strings.Cut(strings.TrimSpace(line), " ")
				n++
				for _, imp := range strings.Fields(imports) {
					if inTestKit(imp) {
						t.Errorf("%s is built from %s, which imports %s", svc, pkg, imp)
					}
				}
			}
			if n < 10 {
				t.Fatalf("go list -deps %s listed %d packages:\n%s", svc, n, out)
			}
		})
	}
}

func inTestKit(pkg string) bool {
	return pkg == testKit || strings.HasPrefix(pkg, testKit+"/")
}

func stderrOf(err error) []byte {
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.Stderr
	}
	return nil
}
