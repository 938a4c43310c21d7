// Package testenv tells tests whether this host has what they need (a
// Docker Engine with runsc, root), the way Go's own internal/testenv does.
//
// A test that needs something the host lacks is skipped on a developer's
// machine, with a message saying what to install. In CI (CI=true in the
// environment) it fails instead: `make test` installs and starts everything
// the tests need, so a missing prerequisite there is a broken set-up, and a
// claim whose test skips would go untested.
package testenv

import (
	"fmt"
	"os"
	"strconv"
)

// TB is the part of testing.TB this package uses.
type TB interface {
	Helper()
	Skip(args ...any)
	Fatal(args ...any)
}

// InCI reports whether the tests run in CI: CI is set to a true value
// ("true", "1", ...), as CI systems set it.
func InCI() bool {
	ci, _ := strconv.ParseBool(os.Getenv("CI"))
	return ci
}

// Missing ends tb because the host lacks a prerequisite that the message,
// formatted as fmt.Sprintf does, names: it skips tb, or fails it in CI.
func Missing(tb TB, format string, args ...any) {
	tb.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		tb.Fatal("CI=true, and " + msg + ": in CI this is a failure, not a skip")
		return
	}
	tb.Skip(msg)
}

// NeedRoot ends tb (see Missing) unless the test runs as root.
func NeedRoot(tb TB, why string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Missing(tb, "%s needs root", why)
	}
}
