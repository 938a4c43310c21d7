// Package rawfile reads the small files and directory listings the runner
// scans on every run and every Reset (/proc, cgroup files, the scratch
// directories) with the fewest system calls: open, read, close.
//
// os.Open adds four or five calls to every file it opens (non-blocking mode
// set, an attempt to register with the poller, the mode cleared again, and
// a stat for ReadFile), and os.File.ReadAt reads again to learn it reached
// the end. Under gVisor every system call is costly, and a run's path read
// a few such files per process: the figures are in the runner's RATIONALE
// ("The runner's own system calls").
package rawfile

import (
	"io/fs"
	"syscall"
)

// Read returns what the first read(2) of path gives, at most len(buf)
// bytes, in buf: the whole of a /proc or cgroup file that fits (such files
// are generated whole at the first read).
func Read(path string, buf []byte) ([]byte, error) {
	fd, err := open(path, syscall.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	n, err := ignoringEINTR(func() (int, error) { return syscall.Read(fd, buf) })
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	return buf[:n], nil
}

// Pread is Read of an open file at offset 0: one system call.
func Pread(fd int, buf []byte) ([]byte, error) {
	n, err := ignoringEINTR(func() (int, error) { return syscall.Pread(fd, buf, 0) })
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// Names returns the names in directory dir but "." and "..", in the order
// the directory gives them.
func Names(dir string) ([]string, error) {
	fd, err := open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	var names []string
	buf := make([]byte, 8<<10)
	for {
		n, err := ignoringEINTR(func() (int, error) { return syscall.ReadDirent(fd, buf) })
		if err != nil {
			return nil, &fs.PathError{Op: "readdirent", Path: dir, Err: err}
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = syscall.ParseDirent(buf[:n], -1, names)
	}
}

func open(path string, mode int) (int, error) {
	fd, err := ignoringEINTR(func() (int, error) { return syscall.Open(path, mode|syscall.O_CLOEXEC, 0) })
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// ignoringEINTR calls f until it is not interrupted by a signal.
func ignoringEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if err != syscall.EINTR {
			return n, err
		}
	}
}
