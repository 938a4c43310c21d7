package runner

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/codemode-go/codemode/agent/internal/runner/rawfile"
)

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestMPLConfigReset checks that a reset leaves matplotlib's directory
// holding exactly the seed's files, whatever a run did to it, and that it
// rewrites nothing when the run only read them.
func TestMPLConfigReset(t *testing.T) {
	seed := mplSeed(t)
	c := &mplConfig{dir: filepath.Join(t.TempDir(), "matplotlib"), seed: seed, uid: os.Getuid(), gid: os.Getgid()}
	list := filepath.Join(c.dir, "fontlist-v1.json")
	check := func(when string) {
		t.Helper()
		if got := c.names(); !slices.Equal(got, []string{"fontlist-v1.json"}) {
			t.Fatalf("%s: files %v, want the seed's only", when, got)
		}
		b, err := os.ReadFile(list)
		if err != nil || string(b) != `{"fonts": 1}` {
			t.Fatalf("%s: font list %q, %v", when, b, err)
		}
		fi, _ := os.Lstat(c.dir)
		if fi.Mode().Perm() != 0o755 {
			t.Fatalf("%s: directory mode %v", when, fi.Mode())
		}
	}
	if err := c.reset(); err != nil {
		t.Fatal(err)
	}
	check("first reset")
	ino := inode(t, list)
	if err := c.reset(); err != nil {
		t.Fatal(err)
	}
	check("untouched")
	if inode(t, list) != ino {
		t.Error("a reset after a run that changed nothing wrote the font list again")
	}

	for _, tc := range []struct {
		name   string
		tamper func() error
	}{
		{"a file added", func() error { return os.WriteFile(filepath.Join(c.dir, "matplotlibrc"), []byte("backend: x"), 0o644) }},
		{"a directory added", func() error { return os.MkdirAll(filepath.Join(c.dir, "tex.cache", "a"), 0o755) }},
		{"the font list removed", func() error { return os.Remove(list) }},
		{"the font list replaced", func() error {
			if err := os.Remove(list); err != nil {
				return err
			}
			return os.WriteFile(list, []byte(`{"fonts": "mine"}`), 0o444)
		}},
		{"the font list made a link", func() error {
			if err := os.Remove(list); err != nil {
				return err
			}
			return os.Symlink(filepath.Join(seed, "fontlist-v1.json"), list)
		}},
		{"the directory's mode changed", func() error { return os.Chmod(c.dir, 0o777) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.tamper(); err != nil {
				t.Fatal(err)
			}
			if c.intact() {
				t.Fatal("intact after the change")
			}
			if err := c.reset(); err != nil {
				t.Fatal(err)
			}
			check("after reset")
		})
	}

	// An image without the seed: an empty directory of the user's.
	bare := &mplConfig{dir: filepath.Join(t.TempDir(), "matplotlib"), seed: filepath.Join(t.TempDir(), "none"), uid: os.Getuid(), gid: os.Getgid()}
	if err := bare.reset(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(bare.dir); err != nil || !fi.IsDir() || len(bare.names()) != 0 {
		t.Errorf("without a seed: %v %v, files %v", fi, err, bare.names())
	}
}

// mplSeed makes TestMPLConfigReset's seed: a font list, and a directory
// that is not copied.
func mplSeed(t *testing.T) string {
	seed := t.TempDir()
	if err := os.WriteFile(filepath.Join(seed, "fontlist-v1.json"), []byte(`{"fonts": 1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(seed, "not-a-file"), 0o755); err != nil {
		t.Fatal(err)
	}
	return seed
}

// names are the files in c's directory, sorted.
func (c *mplConfig) names() []string {
	n, _ := rawfile.Names(c.dir)
	slices.Sort(n)
	return n
}
