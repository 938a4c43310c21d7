package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSecurityClaimsNameRealTests checks that every test the claims table of
// .github/SECURITY.md names exists, as a Go test, benchmark or fuzz target
// (or a node test file) in the package named after it: a claim whose test
// was renamed, moved or deleted fails here.
func TestSecurityClaimsNameRealTests(t *testing.T) {
	r := root(t)
	var dirs []string // every directory with Go or JavaScript tests, relative
	err := filepath.WalkDir(r, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".") && p != r) {
			return filepath.SkipDir
		}
		if !d.IsDir() && (strings.HasSuffix(p, "_test.go") || strings.HasSuffix(p, ".test.mjs")) {
			rel, _ := filepath.Rel(r, filepath.Dir(p))
			if len(dirs) == 0 || dirs[len(dirs)-1] != rel {
				dirs = append(dirs, rel)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A cell is a list of groups: backquoted names, then "(package, ...)".
	group := regexp.MustCompile("((?:`[^`]+`[ ,]*)+)\\(([^)]+)\\)")
	name := regexp.MustCompile("`([^`]+)`")
	claims := 0
	for i, line := range strings.Split(string(must(os.ReadFile(filepath.Join(r, ".github", "SECURITY.md")))), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 4 || !strings.Contains(cells[2], "`Test") {
			continue
		}
		claims++
		groups := group.FindAllStringSubmatch(cells[2], -1)
		if len(groups) == 0 {
			t.Errorf("SECURITY.md:%d: no test with its package in %q", i+1, cells[2])
		}
		for _, g := range groups {
			pkg := strings.TrimSpace(strings.Split(g[2], ",")[0])
			dir := findDir(dirs, pkg)
			if dir == "" {
				t.Errorf("SECURITY.md:%d: no package %q with tests", i+1, pkg)
				continue
			}
			for _, n := range name.FindAllStringSubmatch(g[1], -1) {
				if !hasTest(t, filepath.Join(r, dir), strings.SplitN(n[1], "/", 2)[0]) {
					t.Errorf("SECURITY.md:%d: %s is not a test in %s", i+1, n[1], dir)
				}
			}
		}
	}
	if claims < 50 {
		t.Fatalf("read %d claims with tests from SECURITY.md; the table's form changed?", claims)
	}
}

// findDir finds a package, named by its path, among the directories with
// tests.
func findDir(dirs []string, pkg string) string {
	for _, d := range dirs {
		if d == pkg {
			return d
		}
	}
	return ""
}

// hasTest reports whether a test file in dir defines the Go test, benchmark
// or fuzz target called name, or, for a node test file, names it.
func hasTest(t *testing.T, dir, name string) bool {
	t.Helper()
	files, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	def := regexp.MustCompile(`(?m)^func ` + regexp.QuoteMeta(name) + `\(`)
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), "_test.go") {
			continue
		}
		if def.Match(must(os.ReadFile(filepath.Join(dir, f.Name())))) {
			return true
		}
	}
	return false
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
