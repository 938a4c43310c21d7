package agentd

import (
	"slices"
	"testing"
	"time"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ListLanguages says which modules Python runs find imported, and nothing
// when preloading is off; it is on by default.
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
	if cfg.Preload != "default" {
		t.Errorf("preloading by default: %q, want default", cfg.Preload)
	}
}

// A request's own memory limit, below the sandbox's, bounds what its run
// uses beside a preloaded parent, not the parent's memory too: a run that
// uses little succeeds under a limit below the parent's footprint, and a
// memory bomb under it is still stopped.
func TestPreloadRunMemoryLimit(t *testing.T) {
	a := startAgent(t, func(c *Config) { c.Preload = "default"; c.Memory = 512 << 20 })
	a.waitWarm(t, 1)
	limits := &executionv1.Limits{MemoryBytes: 96 << 20}
	for _, code := range []string{"print(1)", "import numpy\nprint(1)"} {
		r := a.exec(t, &executionv1.Execution{Language: "python", Code: code, Limits: limits, Timeout: durationpb.New(20 * time.Second)})
		if r.GetExitCode() != 0 || r.GetStdout() != "1\n" || r.GetOomKilled() {
			t.Errorf("%q under a 96 MiB limit beside a preloaded parent: %v", code, r)
		}
	}
	r := a.exec(t, &executionv1.Execution{Language: "python", Code: "import numpy\nx = []\nwhile True:\n    x.append(bytearray(8 << 20))",
		Limits: limits, Timeout: durationpb.New(20 * time.Second)})
	if !r.GetOomKilled() {
		t.Errorf("memory bomb under a 96 MiB limit beside a preloaded parent: %v, want oom_killed", r)
	}
}
