package runner

import (
	"syscall"
	"unsafe"
)

// System V IPC objects outlive the processes that made them, so a run could
// leave data in a shared memory segment or a message queue for the next
// one. The reset helper (running as the user, their owner) removes every
// one it can find.
const (
	ipcRMID = 0
	// Per kind: the *_INFO command (returns the highest index in use), the
	// *_STAT_ANY and *_STAT commands (index to id).
	shmInfo, shmStatAny, shmStat = 14, 15, 13
	msgInfo, msgStatAny, msgStat = 12, 13, 11
	semInfo, semStatAny, semStat = 19, 20, 18
)

// maxIPCIndex bounds the scan of indexes; the scan also stops after
// ipcMissRun indexes in a row without an object past the highest index
// *_INFO reported. Linux keeps indexes compact; gVisor numbers objects from
// 1 up, uses the id as the index, and reports 0 from *_INFO.
const (
	maxIPCIndex = 32768
	ipcMissRun  = 256
)

// removeIPC removes the caller's shared memory segments, message queues and
// semaphore sets. It is best effort: it reports no error, and the verified
// part of a reset is the processes and the directories.
func removeIPC() error {
	var buf [512]byte // larger than any of the *_ds and *info structures
	p := uintptr(unsafe.Pointer(&buf[0]))
	shm := func(id, cmd int, arg uintptr) (int, syscall.Errno) {
		r, _, e := syscall.Syscall(syscall.SYS_SHMCTL, uintptr(id), uintptr(cmd), arg)
		return int(r), e
	}
	msg := func(id, cmd int, arg uintptr) (int, syscall.Errno) {
		r, _, e := syscall.Syscall(syscall.SYS_MSGCTL, uintptr(id), uintptr(cmd), arg)
		return int(r), e
	}
	sem := func(id, cmd int, arg uintptr) (int, syscall.Errno) {
		r, _, e := syscall.Syscall6(syscall.SYS_SEMCTL, uintptr(id), 0, uintptr(cmd), arg, 0, 0)
		return int(r), e
	}
	for _, k := range []struct {
		ctl                 func(id, cmd int, arg uintptr) (int, syscall.Errno)
		info, statAny, stat int
	}{
		{shm, shmInfo, shmStatAny, shmStat},
		{msg, msgInfo, msgStatAny, msgStat},
		{sem, semInfo, semStatAny, semStat},
	} {
		hi, e := k.ctl(0, k.info, p)
		if e != 0 || hi < 0 {
			hi = 0
		}
		last := 0
		for i := 0; i < maxIPCIndex && (i <= hi || i-last <= ipcMissRun); i++ {
			r, e := k.ctl(i, k.statAny, p)
			if e != 0 {
				r, e = k.ctl(i, k.stat, p)
			}
			if e != 0 {
				continue
			}
			last = i
			id := i // gVisor answers 0; Linux answers the id
			if r > 0 {
				id = r
			}
			k.ctl(id, ipcRMID, 0)
		}
	}
	return nil
}
