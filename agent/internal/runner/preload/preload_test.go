package preload

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/codemode-go/codemode/agent/internal/languages"
)

// A parent's LD_PRELOAD names a library only if the image has it; the
// other settings pass as they are, and a missing library is logged.
func TestParentEnv(t *testing.T) {
	lib := filepath.Join(t.TempDir(), "lib.so")
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing.so")
	for _, tc := range []struct {
		env, want []string
		logged    bool
	}{
		{[]string{"LD_PRELOAD=" + lib, "MALLOC_TOP_PAD_=1"}, []string{"LD_PRELOAD=" + lib, "MALLOC_TOP_PAD_=1"}, false},
		{[]string{"LD_PRELOAD=" + missing, "MALLOC_TOP_PAD_=1"}, []string{"MALLOC_TOP_PAD_=1"}, true},
		{nil, []string{}, false},
	} {
		var buf bytes.Buffer
		lang := languages.Language{Name: "python", ParentEnv: tc.env}
		got := parentEnv(lang, slog.New(slog.NewTextHandler(&buf, nil)))
		if !slices.Equal(got, tc.want) {
			t.Errorf("parentEnv(%q) = %q, want %q", tc.env, got, tc.want)
		}
		if logged := strings.Contains(buf.String(), missing); logged != tc.logged {
			t.Errorf("parentEnv(%q): logged %v, want %v; log %q", tc.env, logged, tc.logged, buf.String())
		}
		if len(tc.env) > 0 && &got[0] == &tc.env[0] {
			t.Errorf("parentEnv(%q) shares the table's slice", tc.env)
		}
	}
}
