package runner

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

var cleanPathCases = []struct {
	in    string
	dirOK bool
	want  string // "" means refused
}{
	{"a.txt", false, "a.txt"},
	{"a/b/c", false, "a/b/c"},
	{"./a//b/", false, "a/b"},
	{"a/./b", false, "a/b"},
	{"", true, "."},
	{".", true, "."},
	{"", false, ""},
	{".", false, ""},
	{"/etc/passwd", false, ""},
	{"..", true, ""},
	{"../x", false, ""},
	{"a/../../x", false, ""},
	{"a/..", true, ""},
	{"a\x00b", false, ""},
	{"...", false, "..."},
	{"..a", false, "..a"},
}

func TestCleanPath(t *testing.T) {
	t.Parallel()
	for _, tc := range cleanPathCases {
		got, err := cleanPath(tc.in, tc.dirOK)
		if (err != nil) != (tc.want == "") || (err == nil && got != tc.want) {
			t.Errorf("cleanPath(%q, %v) = %q, %v; want %q", tc.in, tc.dirOK, got, err, tc.want)
		}
	}
}

// Whatever cleanPath accepts is a clean relative path with no way up.
func FuzzCleanPath(f *testing.F) {
	for _, tc := range cleanPathCases {
		f.Add(tc.in, tc.dirOK)
	}
	f.Fuzz(func(t *testing.T, in string, dirOK bool) {
		got, err := cleanPath(in, dirOK)
		if err != nil {
			return
		}
		if path.Clean(got) != got || strings.HasPrefix(got, "/") || strings.ContainsRune(got, 0) {
			t.Fatalf("cleanPath(%q) = %q: not clean and relative", in, got)
		}
		for _, el := range strings.Split(got, "/") {
			if el == ".." {
				t.Fatalf("cleanPath(%q) = %q: goes up", in, got)
			}
		}
		if got == "." && !dirOK {
			t.Fatalf("cleanPath(%q) = %q without dirOK", in, got)
		}
	})
}

// TestFilesWithoutOpenat2 checks the file requests where the kernel has no
// openat2 and an os.Root resolves paths instead (on Linux; under gVisor it
// would not confine, see RATIONALE.md).
func TestFilesWithoutOpenat2(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// Before any request: the requests that follow happen after this.
	h.s.ws.Close()
	h.s.ws = nil
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
