package agentd

import (
	"slices"
	"testing"
)

// ListLanguages says which modules Python runs find imported, and nothing
// when preloading is off.
func TestLanguagesPreloaded(t *testing.T) {
	for _, tc := range []struct {
		preload []string
		want    []string
	}{
		{nil, nil},
		{[]string{"numpy", "pandas"}, []string{"numpy", "pandas"}},
	} {
		for _, l := range describeLanguages(nil, tc.preload) {
			want := tc.want
			if l.GetName() != "python" {
				want = nil
			}
			if got := l.GetPreloaded(); !slices.Equal(got, want) {
				t.Errorf("preload %q: %s preloaded %q, want %q", tc.preload, l.GetName(), got, want)
			}
		}
	}
	cfg := DefaultConfig()
	if cfg.Preload != "" {
		t.Errorf("preloading is on by default (%q)", cfg.Preload)
	}
}
