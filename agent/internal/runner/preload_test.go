package runner

import (
	"strings"
	"testing"
)

// startPreloaded starts a sandbox whose runner forks Python runs from a
// preloaded parent with the default modules.
func startPreloaded(t *testing.T) *sandbox {
	t.Helper()
	return startSandboxOpts(t, buildRunner(t), "1g", "-preload=default")
}

// reset scrubs sb as between two unrelated stateless runs.
func (sb *sandbox) reset(t *testing.T) {
	t.Helper()
	if err := sb.c.Reset(t.Context()); err != nil {
		t.Fatalf("reset: %v\n%s", err, sb.log.String())
	}
}

func TestPreloadSmoke(t *testing.T) {
	sb := startPreloaded(t)
	for i := 0; i < 3; i++ {
		r := sb.mustRun(t, "python", "import sys, os; print('pandas' in sys.modules, os.getuid(), os.getcwd(), sys.argv, sys.path[0] == '')")
		t.Logf("%q %q %v", r.stdout, r.stderr, r.exit)
		if !strings.HasPrefix(r.stdout, "True 65534 /workspace ['-c'] True") {
			t.Errorf("stdout %q stderr %q", r.stdout, r.stderr)
		}
		sb.reset(t)
	}
	t.Logf("%s", sb.log.String())
}
