// Package asuser lets the runner, which runs as root, act as the user from
// threads of its own instead of processes: [Do] for one call on a thread
// whose real and effective uids are the user's (Reset's kill(-1) and the
// removal of the user's System V IPC objects), and [FileThread], one thread
// for good whose effective uid is the user's and real and saved uids root's
// (the file requests). See the runner's RATIONALE.md for why threads, and
// why the file thread keeps root as its real uid.
package asuser

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Do calls f on an OS thread of its own that acts as the user (real
// and effective uid, every gid, no supplementary groups, no effective
// capability), and returns what f returns. This is how the runner acts as
// the user without starting a process: a process under gVisor costs tens
// of milliseconds of CPU, a thread far less.
//
// Linux and gVisor keep credentials per thread; the raw setresuid,
// setresgid and setgroups system calls change only the calling thread
// (Go's syscall.Setuid and friends change every thread of the process, and
// must not be used here). The thread keeps root as its saved uid, so that it
// can switch back after f; a change of the effective uid away from 0 clears
// the effective capabilities, and back to 0 restores them. The thread stays
// locked to its goroutine and is never handed back to the scheduler: when the
// goroutine returns while locked, the Go runtime ends the thread instead of
// reusing it, so no other goroutine ever runs with the user's credentials,
// even if the switch back failed. A thread the runtime creates while one is
// locked is cloned from its template thread, not from the locked one, so it
// cannot inherit the user's credentials either. The main thread, which the
// runtime would keep rather than end, is locked to the main goroutine
// (see init), so it is never the one.
//
// Before calling f, Do checks that the thread's real and effective uids
// are the user's and that it holds no effective capability: f may then do
// only what the user could. Callers make sure no process of the user is
// alive while f runs: a thread with the user's uid can be signalled by the
// user's processes.
func Do(uid, gid int, f func() error) error {
	if err := notRunnerUID(uid); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		errc <- onUserThread(uid, gid, f)
	}()
	return <-errc
}

// init locks the main goroutine to the main thread, for good: the Go runtime
// does not end the main thread when a goroutine locked to it returns, so
// Do must never get that thread.
func init() { runtime.LockOSThread() }

func notRunnerUID(uid int) error {
	if uid == os.Getuid() || uid == 0 {
		// The switch would change nothing: f would act for the runner.
		return fmt.Errorf("act as the user: uid %d is the runner's own", uid)
	}
	return nil
}

func onUserThread(uid, gid int, f func() error) (err error) {
	restore, err := becomeUser(uid, gid, true)
	if err != nil {
		return err
	}
	defer func() {
		// Back to the runner's credentials, so that the thread is the
		// user's only while f runs. It ends anyway when its goroutine
		// returns.
		if e := restore(); e != nil {
			err = errors.Join(err, e)
		}
	}()
	return f()
}

// FileThread is an OS thread of the runner that acts as the user towards
// the file system, for good, and runs the work of file requests (see
// package files). Its effective uid, hence its file system uid, and all its gids
// are the user's, it has no supplementary group and no effective
// capability: every open, mkdir and stat it makes is checked as the user's
// would be, and what it creates is the user's.
//
// Unlike Do's thread, its real and saved uids stay root's, which is
// what makes it safe while processes of the user are alive (a session's
// background processes, during a file request): kill(2) and tgkill(2) need
// the sender's real or effective uid to be the target's real or saved uid,
// and ptrace(2) needs all three of the target's uids to be the caller's
// (and the target's permitted capabilities to be the caller's too), on Linux
// and under gVisor alike, so the user's processes can neither signal nor
// trace the thread. (Such a thread would not do for Reset: kill(-1) from it
// would also reach root's processes.)
//
// The thread is locked to its goroutine, which never unlocks it and only
// runs the functions it is given, so no other goroutine ever runs on it;
// threads the runtime creates meanwhile are cloned from its template thread
// (see Do). It is made once: a thread per request cost 1-3 ms more per
// request under gVisor (the runtime ends it and starts another), see
// the runner's RATIONALE.md. Safe for concurrent use; requests are served one at a time.
type FileThread struct {
	work chan func()
	stop chan struct{}
}

// StartFileThread starts the thread and checks its credentials: effective
// uid the user's, real uid root's, no effective capability.
func StartFileThread(uid, gid int) (*FileThread, error) {
	if err := notRunnerUID(uid); err != nil {
		return nil, err
	}
	t := &FileThread{work: make(chan func()), stop: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked, see FileThread
		if _, err := becomeUser(uid, gid, false); err != nil {
			// Returning while locked ends the thread, in whatever state
			// becomeUser left it.
			ready <- err
			return
		}
		ready <- nil
		for {
			select {
			case f := <-t.work:
				f()
			case <-t.stop:
				return
			}
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return t, nil
}

// do runs f on the thread and returns what f returns.
func (t *FileThread) Do(f func() error) error {
	errc := make(chan error, 1)
	select {
	case t.work <- func() { errc <- f() }:
		return <-errc
	case <-t.stop:
		return errors.New("act as the user: the runner is shutting down")
	}
}

// close ends the thread.
func (t *FileThread) Close() { close(t.stop) }

// becomeUser switches the calling thread, which must be locked, to the
// user's credentials: effective uid, all gids, no supplementary group, and
// the real uid too if realToo; the saved uid stays root's. It checks the
// result, and returns how to switch back. On failure it switches back
// before it returns.
func becomeUser(uid, gid int, realToo bool) (restore func() error, err error) {
	if unix.Gettid() == unix.Getpid() {
		return nil, errors.New("act as the user: on the main thread")
	}
	ruid, euid, suid := unix.Getresuid()
	rgid, egid, sgid := unix.Getresgid()
	groups, gerr := unix.Getgroups()
	if gerr != nil {
		return nil, fmt.Errorf("act as the user: read groups: %w", gerr)
	}
	if euid != 0 {
		return nil, errors.New("act as the user: the runner is not root")
	}
	restore = func() error {
		// Allowed by the saved uid 0.
		var errs []error
		if e := setres(syscall.SYS_SETRESUID, ruid, euid, suid); e != nil {
			errs = append(errs, fmt.Errorf("restore uids: %w", e))
		} else {
			if e := setres(syscall.SYS_SETRESGID, rgid, egid, sgid); e != nil {
				errs = append(errs, fmt.Errorf("restore gids: %w", e))
			}
			if e := setgroups(groups); e != nil {
				errs = append(errs, fmt.Errorf("restore groups: %w", e))
			}
		}
		if e := notDumpable(); e != nil {
			errs = append(errs, e)
		}
		if len(errs) > 0 {
			return fmt.Errorf("act as the user: %w", errors.Join(errs...))
		}
		return nil
	}
	fail := func(err error) (func() error, error) {
		return nil, errors.Join(err, restore())
	}
	if e := setgroups(nil); e != nil {
		return fail(fmt.Errorf("act as the user: drop supplementary groups: %w", e))
	}
	if e := setres(syscall.SYS_SETRESGID, gid, gid, gid); e != nil {
		return fail(fmt.Errorf("act as the user: set gid %d: %w", gid, e))
	}
	realUID := ruid
	if realToo {
		realUID = uid
	}
	if e := setres(syscall.SYS_SETRESUID, realUID, uid, 0); e != nil {
		return fail(fmt.Errorf("act as the user: set uid %d: %w", uid, e))
	}
	// A change of effective uid resets the process's dumpable flag to the
	// system's suid_dumpable, which might make the runner dumpable, hence
	// traceable by the user. (gVisor and Debian's default leave it off.)
	if err := notDumpable(); err != nil {
		return fail(fmt.Errorf("act as the user: %w", err))
	}
	if err := checkUserThread(realUID, uid); err != nil {
		return fail(fmt.Errorf("act as the user: %w", err))
	}
	return restore, nil
}

// notDumpable clears the runner's dumpable flag (a per-process attribute)
// and checks that it is clear.
func notDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("clear dumpable: %w", err)
	}
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		return fmt.Errorf("runner is dumpable (%d, %v)", d, err)
	}
	return nil
}

// setres calls setresuid or setresgid on the calling thread only.
func setres(trap uintptr, r, e, s int) error {
	if _, _, errno := syscall.RawSyscall(trap, uintptr(r), uintptr(e), uintptr(s)); errno != 0 {
		return errno
	}
	return nil
}

// setgroups sets the calling thread's supplementary groups only.
func setgroups(gids []int) error {
	g := make([]uint32, len(gids))
	for i, id := range gids {
		g[i] = uint32(id)
	}
	var p unsafe.Pointer
	if len(g) > 0 {
		p = unsafe.Pointer(&g[0])
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_SETGROUPS, uintptr(len(g)), uintptr(p), 0); errno != 0 {
		return errno
	}
	return nil
}

// checkUserThread verifies the calling thread's real and effective uids and
// its capabilities.
func checkUserThread(ruid, euid int) error {
	if r, e, _ := unix.Getresuid(); r != ruid || e != euid {
		return fmt.Errorf("thread uids are %d %d, want %d %d", r, e, ruid, euid)
	}
	// (The file system uid follows the effective one; gVisor has no
	// setfsuid to ask, ENOSYS, and checks files against the effective uid.)
	var caps [2]unix.CapUserData
	if err := unix.Capget(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}, &caps[0]); err != nil {
		return fmt.Errorf("read thread capabilities: %w", err)
	}
	for _, c := range caps {
		if c.Effective != 0 {
			return errors.New("thread still holds effective capabilities")
		}
	}
	return nil
}

// KillAll must run as the user (see Do): kill(-1) then signals
// every process the caller may signal, which for a caller without
// CAP_KILL is every process whose real or saved uid is the caller's real or
// effective uid (the user's), except the caller's own process (the runner)
// and init. The kernel does it in one pass over its process list, which
// forking cannot outrun. (Its result does not say whether any process was
// signalled: Linux fails with ESRCH only when there is no other process at
// all.)
func KillAll() error {
	if err := syscall.Kill(-1, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill user processes: %w", err)
	}
	return nil
}
