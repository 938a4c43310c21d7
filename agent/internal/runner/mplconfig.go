package runner

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/codemode-go/codemode/agent/internal/runner/rawfile"
)

// MPLSeed is where the sandbox image keeps matplotlib's font list, written
// when the image was built (agent/host/setup.sh).
const MPLSeed = "/usr/share/codemode/matplotlib"

// mplConfig is matplotlib's configuration and cache directory in the
// sandbox (MPLCONFIGDIR of user code), in the lib directory: the user's,
// so that matplotlib takes it (it wants a writable one), and made again
// from the image's seed at every reset, so that no run finds what another
// left there. Without it matplotlib would write its font list into the
// workspace ($HOME/.cache/matplotlib), where a stateless run loses it at
// the reset and the next plotting run searches the fonts again (~330 ms
// under gVisor), and where a session finds files it did not write.
type mplConfig struct {
	dir      string // MPLCONFIGDIR
	seed     string // the image's files; missing: none
	uid, gid int    // the user's
	// made are the seed's files as last copied into dir, by name. A file
	// of the runner's own uid that still has its inode and change time has
	// its content: the user can neither write to it nor make one, and no
	// one can set a change time.
	made map[string]madeFile
}

type madeFile struct {
	ino   uint64
	ctime syscall.Timespec
}

func madeOf(fi os.FileInfo) madeFile {
	st := fi.Sys().(*syscall.Stat_t)
	return madeFile{ino: st.Ino, ctime: st.Ctim}
}

// reset makes dir hold exactly copies of the seed's files, the runner's
// and read-only, in a directory of the user's. It changes nothing when dir
// still does, which is the case after a run that only read the font list.
// No process of the user may be running.
func (c *mplConfig) reset() error {
	if c.intact() {
		return nil
	}
	if err := os.RemoveAll(c.dir); err != nil {
		return fmt.Errorf("matplotlib directory: %w", err)
	}
	if err := os.Mkdir(c.dir, 0o755); err != nil {
		return fmt.Errorf("matplotlib directory: %w", err)
	}
	c.made = map[string]madeFile{}
	entries, err := os.ReadDir(c.seed)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("matplotlib seed: %w", err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(c.seed, e.Name()))
		if err != nil {
			return fmt.Errorf("matplotlib seed: %w", err)
		}
		path := filepath.Join(c.dir, e.Name())
		if err := os.WriteFile(path, b, 0o444); err != nil {
			return fmt.Errorf("matplotlib directory: %w", err)
		}
		fi, err := os.Lstat(path)
		if err != nil {
			return fmt.Errorf("matplotlib directory: %w", err)
		}
		c.made[e.Name()] = madeOf(fi)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(c.dir, c.uid, c.gid); err != nil {
			return fmt.Errorf("matplotlib directory: %w", err)
		}
	}
	return nil
}

// intact reports whether dir is as reset left it: the user's directory,
// mode 0755, holding the files made then and nothing else.
func (c *mplConfig) intact() bool {
	if c.made == nil {
		return false
	}
	fi, err := os.Lstat(c.dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o755 {
		return false
	}
	if st := fi.Sys().(*syscall.Stat_t); os.Geteuid() == 0 && int(st.Uid) != c.uid {
		return false
	}
	names, err := rawfile.Names(c.dir)
	if err != nil || len(names) != len(c.made) {
		return false
	}
	for _, n := range names {
		made, ok := c.made[n]
		if !ok {
			return false
		}
		fi, err := os.Lstat(filepath.Join(c.dir, n))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o444 {
			return false
		}
		if madeOf(fi) != made || int(fi.Sys().(*syscall.Stat_t).Uid) != os.Geteuid() {
			return false
		}
	}
	return true
}
