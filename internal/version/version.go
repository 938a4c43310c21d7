// Package version says which build of codemode is running: the release
// version `make dist` stamps into the binaries, else the module's, and the
// source commit the Go toolchain records.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at link time by `make dist`:
//
//	-ldflags "-X github.com/codemode-go/codemode/internal/version.version=v0.2.0"
var version string

// Version is the release version of this build: the one stamped at link
// time, else the main module's version, else "devel".
func Version() string {
	if version != "" {
		return version
	}
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" && info.Main.Version != "(devel)" {
		return info.Main.Version
	}
	return "devel"
}

// Commit is the source commit the binary was built from, with "-dirty"
// when the tree had changes; "unknown" when the toolchain recorded none
// (a build outside a repository, or with -buildvcs=false).
func Commit() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	var rev string
	var dirty bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

// String is the line a binary's --version prints: its name, the version,
// the commit and the Go version.
func String(name string) string {
	return fmt.Sprintf("%s %s (commit %s, %s %s/%s)", name, Version(), Commit(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
