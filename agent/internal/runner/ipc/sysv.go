// Package ipc removes the user's IPC objects, which outlive the processes
// that made them: System V shared memory, message queues and semaphore sets
// (from a thread acting as the user), and POSIX message queues (as root,
// through a directory of the mqueue file system). Reset calls it once no
// process of the user is left.
package ipc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// System V IPC objects outlive the processes that made them, so a run could
// leave data in a shared memory segment, a message queue or a semaphore set
// for the next one. Reset removes the user's, from a thread with the user's
// credentials (see asuser.Do), since only their owner may.
//
// Finding them differs between Linux and gVisor:
//
//   - Linux lists every object in /proc/sysvipc/{shm,msg,sem}.
//   - gVisor has no /proc/sysvipc, and no way to list objects (its *_INFO
//     commands answer 0 for shared memory and queues). But it numbers the
//     objects of each kind from 1 up, never reusing an id until the id space
//     (2^31) wraps. So an object created now (a probe, removed at once) has
//     a higher id than every object alive, and every object created since
//     the last reset has an id between that reset's probe and this one's.
//     Removing each id in that range (one system call per id, no lookup)
//     removes them all. A scan of the whole range up to maxIPCIndex, as an
//     earlier version did, costs ~1500 system calls, ~40 ms under gVisor.
const (
	ipcRMID    = 0
	ipcPrivate = 0
	ipcCreat   = 0o1000
)

// maxIPCScan bounds the ids removed one by one in a reset under gVisor.
// More objects created since the last reset make the reset fail (the agent
// then replaces the sandbox) rather than take seconds.
const maxIPCScan = 1 << 16

// ipcKind is one kind of System V IPC object.
type ipcKind struct {
	name   string // as in /proc/sysvipc
	create func() (int, syscall.Errno)
	remove func(id int) syscall.Errno
}

var ipcKinds = [3]ipcKind{
	{
		name: "shm",
		create: func() (int, syscall.Errno) {
			r, _, e := syscall.RawSyscall(syscall.SYS_SHMGET, ipcPrivate, 1, ipcCreat|0o600)
			return int(r), e
		},
		remove: func(id int) syscall.Errno {
			_, _, e := syscall.RawSyscall(syscall.SYS_SHMCTL, uintptr(id), ipcRMID, 0)
			return e
		},
	},
	{
		name: "msg",
		create: func() (int, syscall.Errno) {
			r, _, e := syscall.RawSyscall(syscall.SYS_MSGGET, ipcPrivate, ipcCreat|0o600, 0)
			return int(r), e
		},
		remove: func(id int) syscall.Errno {
			_, _, e := syscall.RawSyscall(syscall.SYS_MSGCTL, uintptr(id), ipcRMID, 0)
			return e
		},
	},
	{
		name: "sem",
		create: func() (int, syscall.Errno) {
			r, _, e := syscall.RawSyscall(syscall.SYS_SEMGET, ipcPrivate, 1, ipcCreat|0o600)
			return int(r), e
		},
		remove: func(id int) syscall.Errno {
			_, _, e := syscall.RawSyscall6(syscall.SYS_SEMCTL, uintptr(id), 0, ipcRMID, 0, 0, 0)
			return e
		},
	},
}

// Floor is, per kind, the id of the probe of the last reset under
// gVisor: every object with an id up to it was removed then.
type Floor [3]int

// RemoveSysV removes every System V IPC object the calling thread may
// remove. It must run as the user (see asuser.Do). Under gVisor it updates
// floor.
func RemoveSysV(floor *Floor) error {
	if _, err := os.Stat("/proc/sysvipc"); err == nil {
		return removeListedIPC()
	}
	for k, kind := range ipcKinds {
		probe, e := kind.create()
		if e != 0 {
			return fmt.Errorf("remove IPC objects: create a %s probe: %w", kind.name, e)
		}
		kind.remove(probe)
		if probe <= floor[k] || probe-floor[k] > maxIPCScan {
			return fmt.Errorf("remove IPC objects: %d %s ids to scan since the last reset (%d to %d)", probe-floor[k], kind.name, floor[k], probe)
		}
		for id := floor[k] + 1; id < probe; id++ {
			kind.remove(id) // EINVAL: no such object (any more)
		}
		floor[k] = probe
	}
	return nil
}

// removeListedIPC removes the objects listed in /proc/sysvipc (Linux);
// the kernel refuses to remove any that are not the caller's.
func removeListedIPC() error {
	var errs []error
	for _, kind := range ipcKinds {
		ids, err := listIPC("/proc/sysvipc/" + kind.name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, id := range ids {
			kind.remove(id)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove IPC objects: %w", err)
	}
	return nil
}

// listIPC returns the ids (second column) listed in a /proc/sysvipc file.
func listIPC(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var ids []int
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for first := true; sc.Scan(); first = false {
		f := bytes.Fields(sc.Bytes())
		if first || len(f) < 2 {
			continue // the header
		}
		id, err := strconv.Atoi(string(f[1]))
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		ids = append(ids, id)
	}
	return ids, sc.Err()
}
