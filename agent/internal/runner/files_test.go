package runner

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// TestFilesWithoutOpenat2 checks the file requests where the kernel has no
// openat2 and an os.Root resolves paths instead (on Linux; under gVisor it
// would not confine, see RATIONALE.md).
func TestFilesWithoutOpenat2(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// Before any request: the requests that follow happen after this.
	h.s.files.ResolveWithRoot()
	ctx := t.Context()
	outside := filepath.Dir(h.ws)
	if r := h.mustRun("bash", fmt.Sprintf("ln -s %s out; mkdir -p in/sub; ln -s in/sub inlink", outside)); r.exit.GetCode() != 0 {
		t.Fatalf("setup: %v %s", r.exit, r.stderr)
	}
	if err := h.c.WriteFile(ctx, &runnerv1.File{Path: "inlink/a/b.txt", Content: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	if f, err := h.c.ReadFile(ctx, "in/sub/a/b.txt", 0); err != nil || string(f.GetContent()) != "b" {
		t.Fatalf("ReadFile = %v, %v", f, err)
	}
	if _, err := h.c.ReadFile(ctx, "out/workspace/in/sub/a/b.txt", 0); !errors.Is(err, wire.ErrFailedPrecondition) {
		t.Errorf("read through a link out: %v", err)
	}
	if _, err := h.c.ListFiles(ctx, "out"); !errors.Is(err, wire.ErrFailedPrecondition) {
		t.Errorf("list through a link out: %v", err)
	}
	if err := h.c.WriteFile(ctx, &runnerv1.File{Path: "out/x", Content: []byte("x")}); !errors.Is(err, wire.ErrFailedPrecondition) {
		t.Errorf("write through a link out: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); err == nil {
		t.Error("a file was written outside the workspace")
	}
}
