package runner

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

	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// File requests run as root, in a workspace that user code controls, so
// every access goes through an os.Root: a path (symbolic links included)
// cannot leave the workspace, also not by swapping a directory for a link
// while the request is served. Files are opened non-blocking and must be
// regular, so a FIFO planted by user code cannot stall the runner. What the
// runner creates it gives to the user.

// cleanPath checks a path relative to the workspace and returns it cleaned.
// "" and "." name the workspace itself, which only dirOK allows.
func cleanPath(p string, dirOK bool) (string, error) {
	bad := func(why string) error {
		return &reqError{runnerv1.Error_CODE_INVALID_ARGUMENT, fmt.Sprintf("invalid path %q: %s", p, why)}
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
		errors.Is(err, syscall.ENXIO), errors.Is(err, syscall.EEXIST):
		code = runnerv1.Error_CODE_FAILED_PRECONDITION
	case strings.Contains(err.Error(), "escapes from parent") || strings.Contains(err.Error(), "path escapes"):
		code = runnerv1.Error_CODE_FAILED_PRECONDITION
		return &reqError{code, fmt.Sprintf("%s %q: it leads out of the workspace", op, p)}
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err // drop the host path
	}
	return &reqError{code, fmt.Sprintf("%s %q: %v", op, p, err)}
}

func (s *server) writeFile(f *runnerv1.File) error {
	p, err := cleanPath(f.GetPath(), false)
	if err != nil {
		return err
	}
	if n := len(f.GetContent()); n > wire.MaxFileSize {
		return &reqError{runnerv1.Error_CODE_RESOURCE_EXHAUSTED, fmt.Sprintf("file %q has %d bytes, more than the limit of %d", p, n, wire.MaxFileSize)}
	}
	if err := s.mkdirs(path.Dir(p)); err != nil {
		return err
	}
	file, err := s.root.OpenFile(p, os.O_WRONLY|os.O_CREATE|syscall.O_NONBLOCK, 0o600)
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
	if err := s.give(file); err != nil {
		return fileError("write file", p, err)
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
}

// mkdirs creates dir and its missing parents, owned by the user.
func (s *server) mkdirs(dir string) error {
	if dir == "." {
		return nil
	}
	var prefix string
	for _, el := range strings.Split(dir, "/") {
		prefix = path.Join(prefix, el)
		err := s.root.Mkdir(prefix, 0o755)
		if err == nil {
			// Lchown: if user code swapped the new directory for a link,
			// only the link changes owner.
			if os.Geteuid() == 0 {
				if err := s.root.Lchown(prefix, s.cfg.uid, s.cfg.gid); err != nil {
					return fileError("create directory", prefix, err)
				}
			}
			continue
		}
		if !errors.Is(err, fs.ErrExist) {
			return fileError("create directory", prefix, err)
		}
		fi, err := s.root.Stat(prefix)
		if err != nil {
			return fileError("create directory", prefix, err)
		}
		if !fi.IsDir() {
			return &reqError{runnerv1.Error_CODE_FAILED_PRECONDITION, fmt.Sprintf("create directory %q: a file is in the way", prefix)}
		}
	}
	return nil
}

// give makes f the user's.
func (s *server) give(f *os.File) error {
	if os.Geteuid() != 0 {
		return nil
	}
	return f.Chown(s.cfg.uid, s.cfg.gid)
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

func (s *server) readFile(name string, max uint64) (*runnerv1.File, error) {
	p, err := cleanPath(name, false)
	if err != nil {
		return nil, err
	}
	if max == 0 || max > wire.MaxFileSize {
		max = wire.MaxFileSize
	}
	file, err := s.root.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fileError("read file", p, err)
	}
	defer file.Close()
	fi, err := file.Stat()
	if err != nil {
		return nil, fileError("read file", p, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, &reqError{runnerv1.Error_CODE_FAILED_PRECONDITION, fmt.Sprintf("read file %q: not a regular file", p)}
	}
	tooLarge := func(n int64) error {
		return &reqError{runnerv1.Error_CODE_RESOURCE_EXHAUSTED, fmt.Sprintf("read file %q: it has %d bytes, more than the limit of %d", p, n, max)}
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

func (s *server) listFiles(name string) (*runnerv1.FileList, error) {
	p, err := cleanPath(name, true)
	if err != nil {
		return nil, err
	}
	dir, err := s.root.OpenFile(p, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NONBLOCK, 0)
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
	for _, n := range names {
		rel := path.Join(p, n)
		fi, err := s.root.Lstat(rel)
		if err != nil {
			continue // removed meanwhile
		}
		l.Files = append(l.Files, &runnerv1.FileInfo{
			Path: rel,
			Size: uint64(max(fi.Size(), 0)),
			Dir:  fi.IsDir(),
			Mode: uint32(fi.Mode().Perm()),
		})
	}
	return l, nil
}
