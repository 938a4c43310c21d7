package testenv

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a TB that records how it ended.
type recorder struct{ skipped, failed string }

func (r *recorder) Helper()           {}
func (r *recorder) Skip(args ...any)  { r.skipped = fmt.Sprint(args...) }
func (r *recorder) Fatal(args ...any) { r.failed = fmt.Sprint(args...) }

func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		ci         string
		skip, fail bool
	}{
		{ci: "", skip: true},
		{ci: "false", skip: true},
		{ci: "0", skip: true},
		{ci: "true", fail: true},
		{ci: "1", fail: true},
		{ci: "TRUE", fail: true},
	} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			var r recorder
			Missing(&r, "no Docker Engine reachable: %s", "run make setup")
			if got := r.skipped != ""; got != tc.skip {
				t.Errorf("skipped = %q, want a skip: %v", r.skipped, tc.skip)
			}
			if got := r.failed != ""; got != tc.fail {
				t.Errorf("failed = %q, want a failure: %v", r.failed, tc.fail)
			}
			for _, msg := range []string{r.skipped, r.failed} {
				if msg != "" && !strings.Contains(msg, "no Docker Engine reachable: run make setup") {
					t.Errorf("message %q does not say what is missing", msg)
				}
			}
		})
	}
}
