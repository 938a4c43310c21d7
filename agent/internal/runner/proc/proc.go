// Package proc starts the user's processes and ends them: every fork on one
// OS thread of the runner, locked for its lifetime, with no_new_privs set;
// reaping as the sandbox's init; and killing every process of the user, by
// process group, by a scan of /proc, and with kill(-1). See the runner's
// RATIONALE.md ("Forks happen on one locked thread", "Reaping as PID 1",
// "Killing every process of the user").
package proc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/codemode-go/codemode/agent/internal/runner/rawfile"
	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// Config says as whom and where a Table starts processes.
type Config struct {
	UID, GID int    // user code runs as these (if the runner is root)
	Dir      string // working directory of every process: the workspace
	Path     string // PATH that programs are looked up in
	// ReapAll makes the Table wait for every child, adopted orphans
	// included, as an init process must. Off in tests, where the runner
	// shares its process with the test binary and its other children.
	ReapAll bool
	// KillFromFileThread runs kill(-1, SIGKILL) on the file thread (see
	// asuser.FileThread), whose effective uid is the user's and real and
	// saved uids root's: it reaches every process whose real or saved uid
	// is the user's, and neither the preloaded parent (real and saved uid
	// its own) nor the runner. nil without the thread.
	KillFromFileThread func() error
}

// Table starts user processes and collects their exit statuses.
//
// As the container's init process the runner adopts every orphan and must
// reap it, so with ReapAll it waits for any child on SIGCHLD and hands the
// statuses of its own children to their waiters. A child is registered while
// Table.mu is held across its fork, so the reaper (which takes mu after
// reaping) always finds the waiter. Without ReapAll (tests, where the runner
// shares the process with other code that has children) each child is
// waited for by pid.
//
// Every fork happens on one OS thread, locked for the runner's lifetime,
// on which no_new_privs is set: the flag is a per-thread attribute that
// children inherit from the thread that forks them, and Go forks from any
// thread. The same thread makes Pdeathsig reliable (it fires when the
// forking thread ends, and this one never does).
type Table struct {
	cfg Config

	mu      sync.Mutex
	waiters map[int]*Proc

	forks chan forkReq

	lookMu sync.Mutex
	paths  map[string]string // resolved interpreter paths

	// sparing says that a preloaded parent lives, which killing every
	// process must spare (see SetSparing).
	sparing atomic.Bool
}

// Proc is a started process.
type Proc struct {
	Pid    int
	done   chan struct{} // closed when status is set
	status syscall.WaitStatus

	// A Forked process may report its exit code as it exits (Report),
	// before it is reaped.
	ending   chan struct{} // nil for other processes; closed by Report
	endOnce  sync.Once
	reported int32
}

type forkReq struct {
	path  string
	argv  []string
	attr  *syscall.ProcAttr
	reply chan forkReply
}

type forkReply struct {
	pid  int
	proc *Proc // with reapAll: the registered waiter
	err  error
}

// New starts the Table's fork thread, and with cfg.ReapAll its reaper.
func New(cfg Config) *Table {
	p := &Table{cfg: cfg, waiters: make(map[int]*Proc), paths: make(map[string]string), forks: make(chan forkReq)}
	go p.forkThread()
	if cfg.ReapAll {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGCHLD)
		go func() {
			for range sig {
				p.reap()
			}
		}()
	}
	return p
}

// forkThread serves fork requests on a locked OS thread with no_new_privs.
func (p *Table) forkThread() {
	runtime.LockOSThread() // never unlocked: the thread ends with the process
	nnp := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
	for req := range p.forks {
		if nnp != nil {
			req.reply <- forkReply{err: fmt.Errorf("set no_new_privs: %w", nnp)}
			continue
		}
		var r forkReply
		if p.cfg.ReapAll {
			// Registered before mu is released, so that reap finds the
			// waiter however soon the child ends.
			p.mu.Lock()
			r.pid, r.err = syscall.ForkExec(req.path, req.argv, req.attr)
			if r.err == nil {
				r.proc = newProc(r.pid)
				p.waiters[r.pid] = r.proc
			}
			p.mu.Unlock()
		} else {
			r.pid, r.err = syscall.ForkExec(req.path, req.argv, req.attr)
		}
		req.reply <- r
	}
}

func newProc(pid int) *Proc { return &Proc{Pid: pid, done: make(chan struct{})} }

// Forked is a process that another of the runner's processes forked (a
// preloaded parent's child); that process reports how it ended, with
// Finish.
func Forked(pid int) *Proc {
	p := newProc(pid)
	p.ending = make(chan struct{})
	return p
}

// Report records the exit code a Forked process reported itself as it
// exited, and closes Ending. Only the first report counts.
func (p *Proc) Report(code int32) {
	p.endOnce.Do(func() {
		p.reported = code
		close(p.ending)
	})
}

// Ending is closed once a Forked process has reported its exit code
// (Reported): it is exiting, but may not have been reaped. Nil (never
// closed) for other processes.
func (p *Proc) Ending() <-chan struct{} { return p.ending }

// Reported is the exit code the process reported; it is set once Ending is
// closed.
func (p *Proc) Reported() int32 { return p.reported }

// Finish records how a Forked process ended and closes Done.
func (p *Proc) Finish(ws syscall.WaitStatus) {
	p.status = ws
	close(p.done)
}

// Done is closed once the process has ended and its Status is set.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Status is how the process ended; it is set once Done is closed.
func (p *Proc) Status() syscall.WaitStatus { return p.status }

// Alive reports whether the process has not been reaped yet.
func (p *Proc) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// reap collects every exited child.
func (p *Table) reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		p.mu.Lock()
		w := p.waiters[pid]
		delete(p.waiters, pid)
		p.mu.Unlock()
		if w != nil {
			w.status = ws
			close(w.done)
		}
	}
}

// Spec describes a process to start as the user.
type Spec struct {
	Argv  []string
	Env   []string
	Files []*os.File // become fds 0, 1, 2, 3...; nil entries become /dev/null
	// Parent starts a preloaded parent (see package preload): in the
	// user's group but as uid 0, which it leaves before it imports
	// anything.
	Parent bool
}

// UserFiles gives the pipes among files to the user, so that user code can
// also reach them by name (/dev/stdout, /dev/fd/3), which opens the pipe
// anew, and returns files with /dev/null for nil entries; the caller calls
// done once the process has them.
func (p *Table) UserFiles(files []*os.File) (out []*os.File, done func(), err error) {
	var null *os.File
	done = func() {
		if null != nil {
			null.Close()
		}
	}
	out = make([]*os.File, len(files))
	for i, f := range files {
		if f != nil && os.Geteuid() == 0 {
			if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeNamedPipe != 0 {
				if err := f.Chown(p.cfg.UID, p.cfg.GID); err != nil {
					done()
					return nil, nil, fmt.Errorf("give pipe to the user: %w", err)
				}
			}
		}
		if f == nil {
			if null == nil {
				if null, err = os.OpenFile(os.DevNull, os.O_RDWR, 0); err != nil {
					return nil, nil, fmt.Errorf("open %s: %w", os.DevNull, err)
				}
			}
			f = null
		}
		out[i] = f
	}
	return out, done, nil
}

// Start starts s as the user (when the runner is root) in a new process
// group led by the process, in the workspace.
func (p *Table) Start(s Spec) (*Proc, error) {
	path, err := p.LookPath(s.Argv[0])
	if err != nil {
		return nil, err
	}
	files, done, err := p.UserFiles(s.Files)
	if err != nil {
		return nil, err
	}
	defer done()
	fds := make([]uintptr, len(files))
	for i, f := range files {
		fds[i] = f.Fd()
	}
	sys := &syscall.SysProcAttr{
		Setpgid:   true,
		Pdeathsig: syscall.SIGKILL,
	}
	if os.Geteuid() == 0 {
		// An empty Groups list drops supplementary groups; changing uid away
		// from 0 clears the permitted and effective capabilities.
		uid := uint32(p.cfg.UID)
		if s.Parent {
			uid = 0
		}
		sys.Credential = &syscall.Credential{Uid: uid, Gid: uint32(p.cfg.GID), Groups: []uint32{}}
	} else if s.Parent {
		return nil, errors.New("a preloaded parent needs the runner to be root")
	}
	attr := &syscall.ProcAttr{Dir: p.cfg.Dir, Env: s.Env, Files: fds, Sys: sys}

	reply := make(chan forkReply, 1)
	p.forks <- forkReq{path: path, argv: s.Argv, attr: attr, reply: reply}
	r := <-reply
	if r.err != nil {
		return nil, fmt.Errorf("start %s: %w", s.Argv[0], r.err)
	}
	if r.proc != nil {
		return r.proc, nil
	}
	pid := r.pid
	pr := newProc(pid)
	go func() {
		for {
			_, err := syscall.Wait4(pid, &pr.status, 0, nil)
			if err != syscall.EINTR {
				break
			}
		}
		close(pr.done)
	}()
	return pr, nil
}

// LookPath finds the program name in Config.Path, once per name; a program
// missing from the image fails the request with CODE_FAILED_PRECONDITION.
func (p *Table) LookPath(name string) (string, error) {
	p.lookMu.Lock()
	defer p.lookMu.Unlock()
	if path, ok := p.paths[name]; ok {
		return path, nil
	}
	path := name
	if !strings.Contains(name, "/") {
		path = ""
		for _, dir := range filepath.SplitList(p.cfg.Path) {
			candidate := filepath.Join(dir, name)
			if fi, err := os.Stat(candidate); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
				path = candidate
				break
			}
		}
		if path == "" {
			return "", &wire.RunnerError{Code: runnerv1.Error_CODE_FAILED_PRECONDITION, Message: fmt.Sprintf("program %s is not installed in the sandbox image", name)}
		}
	}
	p.paths[name] = path
	return path, nil
}

// ExitCode is the shell's view of a wait status: the exit status, or 128+N
// for a process killed by signal N.
func ExitCode(ws syscall.WaitStatus) int32 {
	switch {
	case ws.Exited():
		return int32(ws.ExitStatus())
	case ws.Signaled():
		return 128 + int32(ws.Signal())
	}
	return -1
}

// UserProc is a process of the user found in /proc.
type UserProc struct {
	Pid, Pgid int
}

// UserProcs lists the live (not zombie) processes whose real, effective,
// saved or filesystem uid is the user's, except those in process group
// keepPgid (0: none).
func (p *Table) UserProcs(keepPgid int) ([]UserProc, error) {
	names, err := rawfile.Names("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	self := os.Getpid()
	var out []UserProc
	var buf [2048]byte
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == self || pid == 1 {
			continue
		}
		// status first: its state and uids settle most processes that
		// are not the user's (a preloaded parent, whose files cost more
		// to read than most, for they sum its memory) in one read.
		if !p.liveOfUser(pid, buf[:]) {
			continue
		}
		st, ok := readStat(pid, buf[:])
		if !ok || st.State == 'Z' || st.State == 'X' {
			continue
		}
		if keepPgid != 0 && st.Pgid == keepPgid {
			continue
		}
		out = append(out, UserProc{Pid: pid, Pgid: st.Pgid})
	}
	return out, nil
}

// Stat is the part of /proc/PID/stat the runner reads.
type Stat struct {
	State byte // R, S, D, Z...
	Pgid  int
}

// Exited reports whether process pid has ended though it may not be reaped
// yet (a zombie), or is gone: what Proc.Alive learns only once the reaper
// has waited for it.
func Exited(pid int) bool {
	st, ok := ReadStat(pid)
	return !ok || st.State == 'Z' || st.State == 'X'
}

// ReadStat parses the state and process group of /proc/pid/stat. The
// command name may hold spaces and parentheses, so fields are counted after
// the last ')'.
func ReadStat(pid int) (Stat, bool) {
	var buf [1024]byte
	return readStat(pid, buf[:])
}

// readStat is ReadStat with buf to read into. The line fits in a few
// hundred bytes: the command name (at most 15 bytes) is the only field of
// any length, the rest are numbers.
func readStat(pid int, buf []byte) (Stat, bool) {
	b, err := rawfile.Read("/proc/"+strconv.Itoa(pid)+"/stat", buf)
	if err != nil {
		return Stat{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return Stat{}, false
	}
	f := bytes.Fields(b[i+2:]) // state ppid pgrp ...
	if len(f) < 3 || len(f[0]) != 1 {
		return Stat{}, false
	}
	pgid, err := strconv.Atoi(string(f[2]))
	if err != nil {
		return Stat{}, false
	}
	return Stat{State: f[0][0], Pgid: pgid}, true
}

// liveOfUser reads /proc/pid/status into buf, which holds its State and
// Uid lines (they come within the first few hundred bytes), and reports
// whether the process is neither a zombie nor dead and is the user's: its
// real, effective, saved or filesystem uid is the user's, and its real uid
// not the preloaded parent's.
func (p *Table) liveOfUser(pid int, buf []byte) bool {
	b, err := rawfile.Read("/proc/"+strconv.Itoa(pid)+"/status", buf)
	if err != nil {
		return false
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte("State:")); ok {
			// Only a state read as ended settles it: anything else is
			// left to the uids, and stat's state after.
			if f := bytes.Fields(rest); len(f) > 0 && (string(f[0]) == "Z" || string(f[0]) == "X") {
				return false
			}
			continue
		}
		rest, ok := bytes.CutPrefix(line, []byte("Uid:"))
		if !ok {
			continue
		}
		for i, f := range bytes.Fields(rest) {
			uid, err := strconv.Atoi(string(f))
			if i == 0 && err == nil && uid == wire.ParentUID && p.cfg.UID != wire.ParentUID {
				// The preloaded parent (real uid), not the user's.
				return false
			}
			if err == nil && uid == p.cfg.UID {
				return true
			}
		}
		return false
	}
	return false
}

// SetSparing says whether a preloaded parent lives, which KillUser must
// spare: its kill(-1) is then the file thread's (Config.KillFromFileThread),
// which reaches only the user's processes.
func (p *Table) SetSparing(on bool) { p.sparing.Store(on) }

// KillUser kills every process of the user, except the process groups in
// keep, and waits until none is left. Processes that fork while they are
// being killed are caught by the next round.
func (p *Table) KillUser(keep []int) error { return p.KillUserEnding(keep, 0) }

// KillUserEnding is KillUser at the end of a run whose main process, pid
// ending, has reported that it is exiting: it is killed with the rest but
// not waited for. Under gVisor a process forked from the preloaded parent
// takes tens of milliseconds to release its address space before it leaves
// /proc; the Reset before the next run waits for it (KillUser). Ending 0 is
// KillUser.
func (p *Table) KillUserEnding(keep []int, ending int) error {
	if ending > 0 {
		if err := syscall.Kill(ending, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill process %d: %w", ending, err)
		}
	}
	keepPgid := 0
	if len(keep) > 0 {
		keepPgid = keep[0]
	}
	if p.cfg.ReapAll {
		// The runner is the sandbox's init and the only process of root
		// there, so kill(-1) reaches every other process in one pass of
		// the kernel, which forking cannot outrun (a fork bomb at its
		// process limit refills each slot the scan below frees, and
		// starves the scan of CPU). Beside a preloaded parent, the
		// kill(-1) is the file thread's, which reaches only the user's
		// processes. With a group to keep, everything is stopped first,
		// the rest killed from the scan, and the kept group continued.
		switch {
		case keepPgid == 0 && !p.sparing.Load():
			_ = syscall.Kill(-1, syscall.SIGKILL)
		case keepPgid == 0 && p.cfg.KillFromFileThread != nil:
			// As one pass of the kernel too, sparing the parent.
			if err := p.cfg.KillFromFileThread(); err != nil {
				return err
			}
		default:
			_ = syscall.Kill(-1, syscall.SIGSTOP)
			defer syscall.Kill(-1, syscall.SIGCONT)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for round := 0; ; round++ {
		ps, err := p.UserProcs(keepPgid)
		if err != nil {
			return err
		}
		if ending > 0 {
			ps = slices.DeleteFunc(ps, func(up UserProc) bool { return up.Pid == ending })
		}
		if len(ps) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kill user processes: %d still alive after %d rounds", len(ps), round)
		}
		for _, up := range ps {
			if err := syscall.Kill(up.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("kill process %d: %w", up.Pid, err)
			}
		}
		if round > 0 {
			time.Sleep(time.Duration(min(round, 20)) * time.Millisecond)
		}
	}
}

// KillGroupBut kills every process of the user in process group pgid but
// process keep, and waits until they are gone.
func (p *Table) KillGroupBut(pgid, keep int) error {
	deadline := time.Now().Add(5 * time.Second)
	for round := 0; ; round++ {
		ps, err := p.UserProcs(0)
		if err != nil {
			return err
		}
		left := 0
		for _, up := range ps {
			if up.Pgid != pgid || up.Pid == keep {
				continue
			}
			left++
			if err := syscall.Kill(up.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("kill process %d: %w", up.Pid, err)
			}
		}
		if left == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kill processes of group %d: %d still alive after %d rounds", pgid, left, round)
		}
		time.Sleep(time.Duration(min(round+1, 20)) * time.Millisecond)
	}
}

// KillGroup kills process group pgid.
func KillGroup(pgid int) {
	if pgid > 1 {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
}
