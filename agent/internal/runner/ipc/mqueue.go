package ipc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// POSIX message queues (mq_open) belong to the IPC namespace, like System V
// objects, and outlive the processes that made them: a run could leave
// queues for the next, unrelated one, whose names (255 bytes each, any
// number of queues), modes and sizes carry data, and under Linux their
// messages too. POSIX shared memory and named semaphores are files in
// /dev/shm, which Reset empties with the other scratch places.
//
// Queues have no path in the sandbox: runsc ignores the mqueue mount of the
// container's spec, so there is no /dev/mqueue, and the runner may not mount
// one (it has no CAP_SYS_ADMIN). Reset reaches them through a directory of
// the mqueue file system of the sandbox's IPC namespace, opened once when
// the runner starts (OpenMqueues), from the first of:
//
//   - /dev/mqueue, where the runtime mounted it (runc);
//   - a detached mount the runner makes itself (fsopen, fsmount), which
//     takes CAP_SYS_ADMIN (tests on a Linux host, as root);
//   - a detached mount made by a helper (gVisor): the runner's own binary,
//     started once in a new user and mount namespace, where it holds
//     CAP_SYS_ADMIN, mounts the mqueue file system of its IPC namespace
//     (the sandbox's: it does not get an IPC namespace of its own) and
//     sends the open directory back over a socket. A thread cannot do
//     it: the kernel (gVisor too) refuses a new user namespace to a
//     process with more than one thread.
//
// Reset then lists the directory and unlinks every queue of the user, as
// root: under gVisor the queues' directory has mode 0555, so that not even
// its owner may remove a queue by mq_unlink, while CAP_DAC_OVERRIDE lets the
// runner.

// mqueueMagic is the file system magic number of mqueue (statfs f_type).
const mqueueMagic = 0x19800202

// MqueueHelperArg, as the only argument, makes the runner's binary the
// helper of OpenMqueues (see the runner's Run).
const MqueueHelperArg = "mount-mqueue"

// MaxMqueues bounds the queues Reset removes one by one. gVisor sets no
// limit on the number of queues (Linux: 256 by default); more than this
// make the reset fail (the agent then replaces the sandbox) rather than
// take seconds.
const MaxMqueues = 1024

// mqueueHelperTimeout bounds the wait for the helper's answer.
const mqueueHelperTimeout = 10 * time.Second

// OpenMqueues opens a directory of the mqueue file system of the runner's
// IPC namespace. helper is the runner's binary, "" to start no helper;
// the helper runs as uid and gid in the parent namespace (see
// mqueueFromHelper). It returns the directory and how it got it.
func OpenMqueues(helper string, uid, gid int) (*os.File, string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/mqueue", &st); err == nil && st.Type == mqueueMagic {
		f, err := os.OpenFile("/dev/mqueue", os.O_RDONLY|unix.O_DIRECTORY, 0)
		if err == nil {
			return f, "/dev/mqueue", nil
		}
	}
	fd, err := mountMqueue()
	if err == nil {
		return os.NewFile(uintptr(fd), "mqueue"), "mount", nil
	}
	if !errors.Is(err, unix.EPERM) || helper == "" {
		return nil, "", fmt.Errorf("open the message queues: %w", err)
	}
	fd, err = mqueueFromHelper(helper, uid, gid)
	if err != nil {
		return nil, "", fmt.Errorf("open the message queues: %w", err)
	}
	return os.NewFile(uintptr(fd), "mqueue"), "helper", nil
}

// mountMqueue mounts the mqueue file system of the caller's IPC namespace,
// detached (in no mount namespace, under no path), and returns its root
// directory, open. The mount goes when the directory is closed.
func mountMqueue() (int, error) {
	fs, err := unix.Fsopen("mqueue", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen mqueue: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("create mqueue: %w", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("fsmount mqueue: %w", err)
	}
	defer unix.Close(mnt)
	dir, err := unix.Openat(mnt, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("open mqueue: %w", err)
	}
	return dir, nil
}

// mqueueFromHelper starts the runner's binary (exe) as the helper
// (RunMqueueHelper) in a new user and mount namespace and returns the
// directory it sends back. The helper is root in its user namespace,
// which maps that root to uid and gid: mapping the runner's own uid 0
// would take CAP_SETFCAP. Callers start no process of the user before the
// helper is done, and no reaper of every child, which would take the
// helper's status.
func mqueueFromHelper(exe string, uid, gid int) (int, error) {
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("mqueue helper: %w", err)
	}
	defer unix.Close(sp[0])
	tv := unix.NsecToTimeval(mqueueHelperTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(sp[0], unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(sp[1])
		return -1, fmt.Errorf("mqueue helper: %w", err)
	}
	closed := ^uintptr(0) // fds 0-2: the helper gets no stdio of the runner
	attr := &syscall.ProcAttr{
		Dir:   "/",
		Env:   []string{},
		Files: []uintptr{closed, closed, closed, uintptr(sp[1])},
		Sys: &syscall.SysProcAttr{
			Cloneflags:                 syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: uid, Size: 1}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: gid, Size: 1}},
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0, Groups: []uint32{}},
			Pdeathsig:                  syscall.SIGKILL,
		},
	}
	// Pdeathsig fires when the forking thread ends: keep it until the
	// helper is done.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	pid, err := syscall.ForkExec(exe, []string{exe, MqueueHelperArg}, attr)
	unix.Close(sp[1])
	if err != nil {
		return -1, fmt.Errorf("start mqueue helper: %w", err)
	}
	fd, rerr := recvMqueue(sp[0])
	if rerr != nil {
		unix.Kill(pid, unix.SIGKILL)
	}
	var ws unix.WaitStatus
	for {
		if _, err := unix.Wait4(pid, &ws, 0, nil); err != unix.EINTR {
			break
		}
	}
	if rerr != nil {
		return -1, fmt.Errorf("mqueue helper (%s): %w", describeStatus(ws), rerr)
	}
	return fd, nil
}

// recvMqueue reads the helper's answer: the directory, or what failed.
func recvMqueue(sock int) (int, error) {
	buf := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(sock, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, err
		}
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil || len(msgs) != 1 {
				return -1, fmt.Errorf("bad answer: %v", err)
			}
			fds, err := unix.ParseUnixRights(&msgs[0])
			if err != nil || len(fds) != 1 {
				for _, fd := range fds {
					unix.Close(fd)
				}
				return -1, fmt.Errorf("bad answer: %v", err)
			}
			return fds[0], nil
		}
		if n == 0 {
			return -1, errors.New("no answer")
		}
		return -1, errors.New(string(buf[:n]))
	}
}

func describeStatus(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return fmt.Sprintf("exit code %d", ws.ExitStatus())
}

// RunMqueueHelper is the helper's main (see mqueueFromHelper): it mounts
// the mqueue file system and sends its root directory over the socket on
// fd 3, or what failed.
func RunMqueueHelper() error {
	var msg, rights []byte
	if dir, err := mountMqueue(); err != nil {
		msg = []byte(err.Error())
	} else {
		msg, rights = []byte{1}, unix.UnixRights(dir)
	}
	if err := unix.Sendmsg(3, msg, rights, nil, 0); err != nil {
		return fmt.Errorf("mqueue helper: send: %w", err)
	}
	return nil
}

// UserMqueues lists the queues in dir (see OpenMqueues) that uid owns.
// In a sandbox every queue is the user's: a queue belongs to its
// creator's effective uid, and user code can map no other uid into a
// user namespace of its own. On a test host, others' queues stay.
func UserMqueues(dir *os.File, uid int) ([]string, error) {
	if _, err := dir.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("list message queues: %w", err)
	}
	names, err := dir.Readdirnames(MaxMqueues + 1)
	if errors.Is(err, io.EOF) || (err == nil && len(names) == 0) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list message queues: %w", err)
	}
	if len(names) > MaxMqueues {
		return nil, fmt.Errorf("more than %d message queues", MaxMqueues)
	}
	fd := int(dir.Fd())
	var mine []string
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if errors.Is(err, unix.ENOENT) {
				continue
			}
			return nil, fmt.Errorf("stat message queue: %w", err)
		}
		if int(st.Uid) == uid {
			mine = append(mine, n)
		}
	}
	return mine, nil
}

// RemoveMqueues unlinks every queue of uid in dir and returns how many
// there were. A queue goes when its last open descriptor closes: callers
// make sure no process of the user is left.
func RemoveMqueues(dir *os.File, uid int) (int, error) {
	names, err := UserMqueues(dir, uid)
	if err != nil {
		return 0, err
	}
	fd := int(dir.Fd())
	var failed int
	var last error
	for _, n := range names {
		if err := unix.Unlinkat(fd, n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			failed, last = failed+1, err
		}
	}
	if failed > 0 {
		// Queue names are user data: not in errors.
		return len(names), fmt.Errorf("remove %d of %d message queues: %w", failed, len(names), last)
	}
	return len(names), nil
}
