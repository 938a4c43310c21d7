// Package files serves the runner's file requests (WriteFile, ReadFile,
// ListFiles, and the files of a Run) in the workspace, which user code
// controls: every path resolved beneath it by the kernel, every request run
// as the user on the file thread (asuser.FileThread). See the runner's
// RATIONALE.md ("Files: openat2 beneath the workspace, on a thread that is
// the user's").
package files

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/codemode-go/codemode/agent/internal/runner/asuser"
	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// MaxListEntries is the most entries ListFiles returns for one directory.
const MaxListEntries = 10000

// File requests come from the agent, for a workspace that user code
// controls and, in a session, while user code may still be running. Three
// layers keep them to what the user could do in the workspace:
//
//   - Every path is resolved beneath the workspace by the kernel: openat2
//     with RESOLVE_BENEATH and RESOLVE_NO_MAGICLINKS from the workspace's
//     directory, one system call per open, so that no link (wherever it is
//     in the path, whatever it points to, and however user code swaps
//     directories for links during the request) leads out of it. Links that
//     stay inside are followed. Where openat2 is missing (Linux before 5.6)
//     an os.Root does it instead; under gVisor an os.Root does not confine
//     (see the runner's RATIONALE.md), so the sandbox needs openat2, which gVisor has.
//   - Every request runs on a thread that acts as the user towards the file
//     system (asuser.FileThread): a path that got out anyway leads only where the
//     user could go, and what the runner creates is the user's from the
//     start.
//   - Files are opened non-blocking and must be regular, so a FIFO planted
//     by user code cannot stall the runner.

// Workspace serves the file requests of the workspace.
type Workspace struct {
	root   *os.Root           // the workspace, where the kernel has no openat2
	ws     *os.File           // the workspace, for openat2; nil: none (see open)
	thread *asuser.FileThread // runs the requests as the user; nil: the runner is not root
}

// Open opens the workspace dir, whose requests thread runs (nil: the runner
// itself, when it is not root and has no privilege to lend).
func Open(dir string, thread *asuser.FileThread) (*Workspace, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	ws, err := openWorkspace(dir)
	if err != nil {
		root.Close()
		return nil, fmt.Errorf("open workspace: %w", err)
	}
	return &Workspace{root: root, ws: ws, thread: thread}, nil
}

// HasOpenat2 says whether paths are resolved with openat2. Without it (Linux
// before 5.6) an os.Root resolves them, which does not confine them under
// gVisor.
func (w *Workspace) HasOpenat2() bool { return w.ws != nil }

// ResolveWithRoot makes w resolve paths with its os.Root, as where the
// kernel has no openat2: for the tests of that path. Call it before any
// request.
func (w *Workspace) ResolveWithRoot() {
	if w.ws != nil {
		w.ws.Close()
		w.ws = nil
	}
}

// Close closes the workspace's descriptors (not the thread).
func (w *Workspace) Close() {
	w.root.Close()
	if w.ws != nil {
		w.ws.Close()
	}
}

// MakeDir creates dir, a clean path relative to the workspace, and its
// missing parents, as the user's.
func (w *Workspace) MakeDir(dir string) error {
	return w.onFileThread(func() error { return w.mkdirs(dir) })
}

// cleanPath checks a path relative to the workspace and returns it cleaned.
// "" and "." name the workspace itself, which only dirOK allows.
func cleanPath(p string, dirOK bool) (string, error) {
	bad := func(why string) error {
		return &wire.RunnerError{Code: runnerv1.Error_CODE_INVALID_ARGUMENT, Message: fmt.Sprintf("invalid path %q: %s", p, why)}
	}
	if strings.ContainsRune(p, 0) {
		return "", bad("it contains a NUL byte")
	}
	if strings.HasPrefix(p, "/") {
		return "", bad("it must be relative to the workspace")
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return "", bad(`it must not contain ".."`)
		}
	}
	c := path.Clean("./" + p)
	if c == "." && !dirOK {
		return "", bad("it names the workspace itself")
	}
	return c, nil
}

// fileError turns an error of the file system into one that tells the agent
// what went wrong, naming the path relative to the workspace only.
func fileError(op, p string, err error) error {
	var code runnerv1.Error_Code
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code = runnerv1.Error_CODE_NOT_FOUND
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.EFBIG):
		code = runnerv1.Error_CODE_RESOURCE_EXHAUSTED
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ELOOP),
		errors.Is(err, syscall.ENXIO), errors.Is(err, syscall.EEXIST),
		errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EROFS):
		code = runnerv1.Error_CODE_FAILED_PRECONDITION
	case errors.Is(err, syscall.EXDEV),
		strings.Contains(err.Error(), "escapes from parent") || strings.Contains(err.Error(), "path escapes"):
		code = runnerv1.Error_CODE_FAILED_PRECONDITION
		return &wire.RunnerError{Code: code, Message: fmt.Sprintf("%s %q: it leads out of the workspace", op, p)}
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err // drop the host path
	}
	return &wire.RunnerError{Code: code, Message: fmt.Sprintf("%s %q: %v", op, p, err)}
}

// Write writes f, making its missing directories.
func (w *Workspace) Write(f *runnerv1.File) error {
	p, err := cleanPath(f.GetPath(), false)
	if err != nil {
		return err
	}
	if n := len(f.GetContent()); n > wire.MaxFileSize {
		return &wire.RunnerError{Code: runnerv1.Error_CODE_RESOURCE_EXHAUSTED, Message: fmt.Sprintf("file %q has %d bytes, more than the limit of %d", p, n, wire.MaxFileSize)}
	}
	return w.onFileThread(func() error {
		if err := w.mkdirs(path.Dir(p)); err != nil {
			return err
		}
		file, err := w.open(p, os.O_WRONLY|os.O_CREATE|syscall.O_NONBLOCK, 0o600)
		if err != nil {
			return fileError("write file", p, err)
		}
		defer file.Close()
		if err := regular(file); err != nil {
			return fileError("write file", p, err)
		}
		mode := os.FileMode(f.GetMode()) & os.ModePerm
		if mode == 0 {
			mode = 0o644
		}
		if err := file.Chmod(mode); err != nil {
			return fileError("write file", p, err)
		}
		if err := file.Truncate(0); err != nil {
			return fileError("write file", p, err)
		}
		if _, err := file.Write(f.GetContent()); err != nil {
			return fileError("write file", p, err)
		}
		return nil
	})
}

// mkdirs creates dir and its missing parents. It runs on the file thread,
// so they are the user's.
func (w *Workspace) mkdirs(dir string) error {
	if dir == "." {
		return nil
	}
	// Most often it is there already: one system call.
	if d, err := w.open(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NONBLOCK, 0); err == nil {
		d.Close()
		return nil
	}
	parent := "."
	for _, el := range strings.Split(dir, "/") {
		prefix := path.Join(parent, el)
		d, err := w.open(parent, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NONBLOCK, 0)
		if err != nil {
			return fileError("create directory", parent, err)
		}
		err = unix.Mkdirat(int(d.Fd()), el, 0o755)
		d.Close()
		parent = prefix
		if err == nil {
			continue
		}
		if !errors.Is(err, fs.ErrExist) {
			return fileError("create directory", prefix, err)
		}
		// There already: a directory, or a link to one in the workspace.
		d, err = w.open(prefix, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NONBLOCK, 0)
		if errors.Is(err, syscall.ENOTDIR) {
			return &wire.RunnerError{Code: runnerv1.Error_CODE_FAILED_PRECONDITION, Message: fmt.Sprintf("create directory %q: a file is in the way", prefix)}
		}
		if err != nil {
			return fileError("create directory", prefix, err)
		}
		d.Close()
	}
	return nil
}

// onFileThread runs a file request's work f as the user, on the file
// thread (see asuser.FileThread), or as the runner itself when the runner is not
// root (tests), which then has no privilege to lend.
func (w *Workspace) onFileThread(f func() error) error {
	if w.thread == nil {
		return f()
	}
	return w.thread.Do(f)
}

// open opens p, a path cleaned by cleanPath, beneath the workspace (see the
// top of this file). The file is close-on-exec.
func (w *Workspace) open(p string, flag int, perm uint32) (*os.File, error) {
	if w.ws == nil {
		return w.root.OpenFile(p, flag, os.FileMode(perm))
	}
	how := &unix.OpenHow{
		Flags:   uint64(flag | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	}
	if flag&os.O_CREATE != 0 {
		how.Mode = uint64(perm)
	}
	for try := 0; ; try++ {
		fd, err := unix.Openat2(int(w.ws.Fd()), p, how)
		if err == unix.EINTR || err == unix.EAGAIN && try < 8 {
			// EAGAIN: the kernel saw a rename or mount during a walk
			// through "..", and would rather start again.
			continue
		}
		if err != nil {
			return nil, &fs.PathError{Op: "openat2", Path: p, Err: err}
		}
		return os.NewFile(uintptr(fd), p), nil
	}
}

// openWorkspace opens the workspace for open, or returns nil when the
// kernel has no openat2 (open then uses the os.Root).
func openWorkspace(dir string) (*os.File, error) {
	ws, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Openat2(int(ws.Fd()), ".", &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH})
	if err == unix.ENOSYS {
		ws.Close()
		return nil, nil
	}
	if err != nil {
		ws.Close()
		return nil, fmt.Errorf("openat2: %w", err)
	}
	unix.Close(fd)
	return ws, nil
}

func regular(f *os.File) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (%v)", fi.Mode().Type())
	}
	return nil
}

// Read reads the file name, up to max bytes (0: wire.MaxFileSize).
func (w *Workspace) Read(name string, max uint64) (*runnerv1.File, error) {
	p, err := cleanPath(name, false)
	if err != nil {
		return nil, err
	}
	if max == 0 || max > wire.MaxFileSize {
		max = wire.MaxFileSize
	}
	var f *runnerv1.File
	err = w.onFileThread(func() (err error) {
		f, err = w.readFileAsUser(p, max)
		return err
	})
	return f, err
}

func (w *Workspace) readFileAsUser(p string, max uint64) (*runnerv1.File, error) {
	file, err := w.open(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fileError("read file", p, err)
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return nil, fileError("read file", p, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, &wire.RunnerError{Code: runnerv1.Error_CODE_FAILED_PRECONDITION, Message: fmt.Sprintf("read file %q: not a regular file", p)}
	}
	tooLarge := func(n int64) error {
		return &wire.RunnerError{Code: runnerv1.Error_CODE_RESOURCE_EXHAUSTED, Message: fmt.Sprintf("read file %q: it has %d bytes, more than the limit of %d", p, n, max)}
	}
	if uint64(fi.Size()) > max {
		return nil, tooLarge(fi.Size())
	}
	// The file may grow while it is read: read at most one byte past max.
	b, err := io.ReadAll(io.LimitReader(file, int64(max)+1))
	if err != nil {
		return nil, fileError("read file", p, err)
	}
	if uint64(len(b)) > max {
		return nil, tooLarge(int64(len(b)))
	}
	return &runnerv1.File{Path: p, Content: b, Mode: uint32(fi.Mode().Perm())}, nil
}

// List lists the directory name ("" or "." for the workspace itself).
func (w *Workspace) List(name string) (*runnerv1.FileList, error) {
	p, err := cleanPath(name, true)
	if err != nil {
		return nil, err
	}
	var l *runnerv1.FileList
	err = w.onFileThread(func() (err error) {
		l, err = w.listFilesAsUser(p)
		return err
	})
	return l, err
}

func (w *Workspace) listFilesAsUser(p string) (*runnerv1.FileList, error) {
	dir, err := w.open(p, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fileError("list", p, err)
	}
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return nil, fileError("list", p, err)
	}
	slices.Sort(names)
	l := &runnerv1.FileList{}
	if len(names) > MaxListEntries {
		names, l.Truncated = names[:MaxListEntries], true
	}
	fd := int(dir.Fd())
	for _, n := range names {
		// Relative to the directory opened above: nothing is resolved
		// again.
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue // removed meanwhile
		}
		l.Files = append(l.Files, &runnerv1.FileInfo{
			Path: path.Join(p, n),
			Size: uint64(max(st.Size, 0)),
			Dir:  st.Mode&unix.S_IFMT == unix.S_IFDIR,
			Mode: st.Mode & 0o777,
		})
	}
	return l, nil
}
