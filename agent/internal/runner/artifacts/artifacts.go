// Package artifacts finds a run's artifacts: the regular files of the
// workspace's outputs directory that are new or changed since the run
// began, read without following a link and without lending user code the
// runner's privileges. See the runner's RATIONALE.md ("Artifacts: a walk
// before and after each run, no link followed").
package artifacts

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// Artifacts are the files a run leaves in the workspace's outputs directory
// (wire.OutputsDir). The runner walks the directory before and after each run
// and returns the regular files that are new or changed in the run's Exit.
//
// The walk runs as root in a directory that user code controls, so it
// follows no symbolic link at all (every step is an openat or fstatat with
// O_NOFOLLOW or AT_SYMLINK_NOFOLLOW relative to the directory it came
// from), opens files non-blocking and takes only regular ones, and reads only
// files the user could read (owned by the user, or readable by the user's
// group or by others): the runner's CAP_DAC_OVERRIDE must not lend user code
// its reach.

// Bounds of the walk, besides wire.MaxArtifacts and wire.MaxArtifactBytes:
// entries looked at, and directory depth below the outputs directory.
const (
	maxOutputEntries = 4096
	maxOutputDepth   = 8
)

// stamp tells whether a file changed between two walks.
type stamp struct {
	ino, size uint64
	mtime     int64 // ns
}

// outputFile is one regular file found by a walk.
type outputFile struct {
	name  string // relative to the outputs directory
	dirfd int    // its directory, open during the walk's callback only
	base  string // its name in dirfd
	stamp stamp
	stat  unix.Stat_t
}

// Dir is the outputs directory of a workspace, as the user sees it.
type Dir struct {
	Workspace string
	UID, GID  int // the user's
	Log       *slog.Logger
}

// Snapshot is what the outputs directory held before a run.
type Snapshot map[string]stamp

// Snapshot returns what the outputs directory holds now, for Collect to
// compare against. A directory that cannot be read gives an empty
// snapshot: the run goes on, and reports what it can at the end.
func (d Dir) Snapshot() Snapshot {
	snap := make(Snapshot)
	if err := d.walk(func(f *outputFile) bool {
		snap[f.name] = f.stamp
		return true
	}); err != nil {
		d.Log.Debug("list outputs before the run", "error", err)
	}
	return snap
}

// Collect fills exit with the files that are new or changed since before
// (see Snapshot), in name order, within wire.MaxArtifacts and
// wire.MaxArtifactBytes; it marks exit.ArtifactsTruncated when it leaves any
// out. It runs once the run's processes have ended (a stateless run) or
// stopped writing as far as the run is concerned (a session's background
// processes may still write; a file that changes while it is read is read
// as it then is).
func (d Dir) Collect(exit *runnerv1.Exit, before Snapshot) {
	var found []*runnerv1.Artifact
	var total int
	truncated := false
	err := d.walk(func(f *outputFile) bool {
		if old, ok := before[f.name]; ok && old == f.stamp {
			return true
		}
		if !d.userMayRead(&f.stat) {
			return true
		}
		if len(found) == wire.MaxArtifacts || total+int(f.stamp.size) > wire.MaxArtifactBytes {
			truncated = true
			return true
		}
		b, err := readOutput(f, wire.MaxArtifactBytes-total)
		switch {
		case errors.Is(err, errTooLarge):
			truncated = true
			return true
		case err != nil:
			d.Log.Debug("read output file", "error", err)
			return true
		}
		total += len(b)
		found = append(found, &runnerv1.Artifact{Name: f.name, MediaType: mediaType(f.name, b), Content: b})
		return true
	})
	if errors.Is(err, errTooMany) {
		truncated = true
	} else if err != nil {
		d.Log.Debug("collect artifacts", "error", err)
	}
	exit.Artifacts, exit.ArtifactsTruncated = found, truncated
}

var (
	errTooLarge = errors.New("file larger than what is left of the artifact limit")
	errTooMany  = errors.New("outputs directory has more entries than the runner looks at")
)

// readOutput reads f, which must still be the regular file the walk saw,
// up to max bytes.
func readOutput(f *outputFile, max int) ([]byte, error) {
	fd, err := unix.Openat(f.dirfd, f.base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	file := os.NewFile(uintptr(fd), f.base)
	defer file.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Ino != f.stat.Ino || st.Dev != f.stat.Dev {
		return nil, errors.New("replaced while the outputs were read")
	}
	// The file may grow while it is read: read at most one byte past max.
	b, err := io.ReadAll(io.LimitReader(file, int64(max)+1))
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	if len(b) > max {
		return nil, errTooLarge
	}
	return b, nil
}

// userMayRead says whether user code could read a file of these owner and
// mode bits (the user holds no capabilities and no supplementary groups).
func (d Dir) userMayRead(st *unix.Stat_t) bool {
	switch {
	case int(st.Uid) == d.UID:
		return st.Mode&0o400 != 0
	case int(st.Gid) == d.GID:
		return st.Mode&0o040 != 0
	}
	return st.Mode&0o004 != 0
}

// walk calls fn for every regular file below the outputs directory,
// in name order, without following symbolic links, until fn returns false.
// A missing outputs directory (or one that is not a directory) holds no
// files.
func (d Dir) walk(fn func(*outputFile) bool) error {
	ws, err := unix.Open(d.Workspace, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open workspace: %w", err)
	}
	defer unix.Close(ws)
	dir, err := openDirNoFollow(ws, wire.OutputsDir)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
			return nil
		}
		return fmt.Errorf("open outputs directory: %w", err)
	}
	w := &outputWalk{fn: fn}
	err = w.dir(dir, "", 0)
	if errors.Is(err, errStopWalk) {
		return nil
	}
	return err
}

var errStopWalk = errors.New("walk stopped")

// openDirNoFollow opens the directory name in dirfd, and fails if name is a
// symbolic link (ELOOP) or not a directory (ENOTDIR). It does not use
// O_NOFOLLOW|O_DIRECTORY: gVisor follows a final link when O_DIRECTORY is
// given, O_NOFOLLOW or not (see the runner's RATIONALE.md). Without O_DIRECTORY,
// O_NOFOLLOW refuses a link there too, and fstat tells a directory; opened
// non-blocking, a FIFO does not stall the open.
func openDirNoFollow(dirfd int, name string) (int, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		return -1, unix.ENOTDIR
	}
	return fd, nil
}

type outputWalk struct {
	fn      func(*outputFile) bool
	entries int
}

// dir walks the directory open as fd (which it closes), named prefix below
// the outputs directory, depth levels down.
func (w *outputWalk) dir(fd int, prefix string, depth int) error {
	d := os.NewFile(uintptr(fd), "outputs")
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("list outputs directory: %w", err)
	}
	slices.Sort(names)
	var tooMany error
	for _, n := range names {
		if w.entries++; w.entries > maxOutputEntries {
			return errTooMany
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed meanwhile
		}
		name := path.Join(prefix, n)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			f := &outputFile{name: name, dirfd: fd, base: n, stat: st,
				stamp: stamp{ino: st.Ino, size: uint64(max(st.Size, 0)), mtime: st.Mtim.Nano()}}
			if !w.fn(f) {
				return errStopWalk
			}
		case unix.S_IFDIR:
			if depth+1 > maxOutputDepth {
				tooMany = errTooMany
				continue
			}
			sub, err := openDirNoFollow(fd, n)
			if err != nil {
				continue // removed or replaced meanwhile
			}
			if err := w.dir(sub, name, depth+1); err != nil {
				return err
			}
		}
	}
	return tooMany
}

// mediaType names the media type of a file: by the extension of its name
// (the sandbox's /etc/mime.types, then Go's own table), else by sniffing
// its content.
func mediaType(name string, content []byte) string {
	if ext := path.Ext(name); ext != "" {
		if t := mime.TypeByExtension(strings.ToLower(ext)); t != "" {
			return t
		}
	}
	return http.DetectContentType(content)
}
