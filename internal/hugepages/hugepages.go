// Package hugepages reads the host's transparent huge page settings as they
// bear on gVisor's sandbox memory.
//
// runsc backs a sandbox's memory with huge pages only where the host lets
// shared memory have them (/sys/kernel/mm/transparent_hugepage/shmem_enabled
// always, within_size or force; or advise with a defrag of always, defer or
// never). How it then commits that memory matters for the memory limit: under
// advise it writes the memory through its own mapping, and a write past the
// container's limit makes the host's OOM killer take the whole sandbox; under
// the others it commits a large allocation with fallocate(2), which fails at
// the limit, and gVisor kills only the process that asked. The runner's
// memory watchdog relies on the latter when a fast allocator gets past it
// (agent/internal/runner/RATIONALE.md). agent/host/setup.sh sets within_size.
package hugepages

import (
	"os"
	"path/filepath"
	"strings"
)

// Dir is where Linux shows the settings.
const Dir = "/sys/kernel/mm/transparent_hugepage"

// Settings are the two settings runsc reads when a sandbox starts: the
// selected values of Dir's shmem_enabled and defrag; "?" for one that
// cannot be read.
type Settings struct {
	ShmemEnabled, Defrag string
}

// Host reads the host's settings.
func Host() Settings {
	return Settings{ShmemEnabled: setting("shmem_enabled"), Defrag: setting("defrag")}
}

// setting returns the selected value (the one in brackets) of the file name
// in Dir; "?" if it cannot be read.
func setting(name string) string {
	b, err := os.ReadFile(filepath.Join(Dir, name))
	if err != nil {
		return "?"
	}
	return selected(string(b))
}

// selected returns the value in brackets of a setting's file; "?" if none.
func selected(file string) string {
	_, rest, ok := strings.Cut(file, "[")
	v, _, ok2 := strings.Cut(rest, "]")
	if !ok || !ok2 || v == "" {
		return "?"
	}
	return v
}

// String is "shmem_enabled within_size, defrag madvise".
func (s Settings) String() string {
	return "shmem_enabled " + s.ShmemEnabled + ", defrag " + s.Defrag
}

// Sandboxes reports whether runsc backs sandbox memory with huge pages under
// s (runsc/boot/loader.go).
func (s Settings) Sandboxes() bool {
	switch s.ShmemEnabled {
	case "always", "within_size", "force":
		return true
	case "advise":
		return s.WriteCommitted()
	}
	return false
}

// WriteCommitted reports whether runsc commits huge-page memory by writing
// it under s, so that a large allocation past a sandbox's memory limit takes
// the whole sandbox rather than the process that made it: shmem_enabled
// advise with a defrag that does not compact directly.
func (s Settings) WriteCommitted() bool {
	if s.ShmemEnabled != "advise" {
		return false
	}
	switch s.Defrag {
	case "always", "defer", "never":
		return true
	}
	return false
}
