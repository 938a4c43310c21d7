package testkit

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// modulePath is this repository's module.
const modulePath = "github.com/codemode-go/codemode"

// ModuleRoot returns the directory of this repository's go.mod, looked for
// from the working directory up (a test runs in its package's directory).
// It runs no go command, whose start can fail for reasons of its own.
func ModuleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find module root: %w", err)
	}
	for dir := wd; ; {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && moduleOf(b) == modulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("find module root: no go.mod of %s in %s or above", modulePath, wd)
		}
		dir = parent
	}
}

// moduleOf returns the module path a go.mod declares.
func moduleOf(gomod []byte) string {
	for line := range strings.SplitSeq(string(gomod), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`)
		}
	}
	return ""
}
