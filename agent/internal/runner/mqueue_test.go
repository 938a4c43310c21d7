package runner

import (
	"errors"
	"fmt"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/codemode-go/codemode/internal/testkit/testenv"
)

// mqOpen calls mq_open (name without the leading slash, as the system call
// takes it) from the test process.
func mqOpen(name string, flags int) (int, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return -1, err
	}
	fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), uintptr(flags), 0o600, 0, 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

func mqUnlink(name string) error {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return err
	}
	if _, _, e := unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(p)), 0, 0); e != 0 {
		return e
	}
	return nil
}

// On a Linux host Reset removes the user's POSIX message queues (here with
// a message in them) and leaves those of other uids: the mqueue file system
// is the host's. TestSandboxReset checks the same under gVisor.
func TestResetMessageQueues(t *testing.T) {
	if !isRoot() {
		testenv.Missing(t, "Reset needs root to act as the user")
	}
	t.Parallel()
	h := newHarness(t)
	if h.s.mqueues == nil {
		t.Fatalf("the runner has no message queue directory: %v", h.s.mqErr)
	}
	mine := fmt.Sprintf("codemode-test-%d", h.uid)
	other := fmt.Sprintf("codemode-test-root-%d", h.uid)
	fd, err := mqOpen(other, unix.O_CREAT|unix.O_EXCL|unix.O_RDWR)
	if err != nil {
		t.Fatalf("create root's queue: %v", err)
	}
	unix.Close(fd)
	t.Cleanup(func() { mqUnlink(other) })
	t.Cleanup(func() { mqUnlink(mine) }) // if Reset failed to

	const probe = `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def err(ok):
    return 0 if ok else ctypes.get_errno()
`
	create := probe + fmt.Sprintf(`
q = libc.mq_open(b"/%s", os.O_CREAT | os.O_EXCL | os.O_WRONLY, ctypes.c_uint(0o600), None)
print("mq_open", err(q >= 0))
print("mq_send", err(libc.mq_send(q, b"secret", ctypes.c_size_t(6), ctypes.c_uint(0)) == 0))
`, mine)
	if r := h.mustRun("python", create); r.stdout != "mq_open 0\nmq_send 0\n" {
		t.Fatalf("create the user's queue: %q %q", r.stdout, r.stderr)
	}
	// The queue outlives the run that made it.
	if fd, err := mqOpen(mine, unix.O_RDONLY); err != nil {
		t.Fatalf("the user's queue is gone before Reset: %v", err)
	} else {
		unix.Close(fd)
	}
	if err := h.c.Reset(t.Context()); err != nil {
		t.Fatal(err)
	}
	look := probe + fmt.Sprintf(`print("mq_open", err(libc.mq_open(b"/%s", os.O_RDONLY) >= 0))`, mine)
	if r := h.mustRun("python", look); r.stdout != fmt.Sprintf("mq_open %d\n", unix.ENOENT) {
		t.Errorf("after Reset the user's queue: %q %q", r.stdout, r.stderr)
	}
	if fd, err := mqOpen(mine, unix.O_RDONLY); !errors.Is(err, unix.ENOENT) {
		t.Errorf("after Reset the user's queue opens as root: %v", err)
		if err == nil {
			unix.Close(fd)
		}
	}
	if fd, err := mqOpen(other, unix.O_RDONLY); err != nil {
		t.Errorf("Reset removed root's queue: %v", err)
	} else {
		unix.Close(fd)
	}
}
