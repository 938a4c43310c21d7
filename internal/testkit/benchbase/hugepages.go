package benchbase

import (
	"os"
	"strings"
)

// HugePages describes the host's transparent huge pages as they bear on
// gVisor, which backs sandbox memory with them only under shmem_enabled
// always, within_size or force, or advise with a defrag that does not
// compact directly (agent/host/setup.sh, step 2b): "shmem_enabled advise,
// defrag defer"; "?" for a setting that cannot be read.
func HugePages() string {
	return "shmem_enabled " + HugePageSetting("shmem_enabled") + ", defrag " + HugePageSetting("defrag")
}

// HugePageSetting returns the selected value (the one in brackets) of the
// file name of /sys/kernel/mm/transparent_hugepage; "?" if it cannot be
// read.
func HugePageSetting(name string) string {
	b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/" + name)
	if err != nil {
		return "?"
	}
	_, rest, ok := strings.Cut(string(b), "[")
	v, _, ok2 := strings.Cut(rest, "]")
	if !ok || !ok2 {
		return "?"
	}
	return v
}
