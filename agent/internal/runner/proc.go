package runner

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// procs starts user processes and collects their exit statuses.
//
// As the container's init process the runner adopts every orphan and must
// reap it, so with reapAll it waits for any child on SIGCHLD and hands the
// statuses of its own children to their waiters. A child is registered while
// procs.mu is held across its fork, so the reaper (which takes mu after
// reaping) always finds the waiter. Without reapAll (tests, where the runner
// shares the process with other code that has children) each child is
// waited for by pid.
//
// Every fork happens on one OS thread, locked for the runner's lifetime,
// on which no_new_privs is set: the flag is a per-thread attribute that
// children inherit from the thread that forks them, and Go forks from any
// thread. The same thread makes Pdeathsig reliable (it fires when the
// forking thread ends, and this one never does).
type procs struct {
	cfg config

	mu      sync.Mutex
	waiters map[int]*proc

	forks chan forkReq

	lookMu sync.Mutex
	paths  map[string]string // resolved interpreter paths

	// sparing says that a preloaded parent lives, which killing every
	// process must spare (see parent).
	sparing atomic.Bool
	// killFromFileThread runs kill(-1, SIGKILL) on the file thread (see
	// asuser.FileThread), whose effective uid is the user's and real and saved
	// uids root's: it reaches every process whose real or saved uid is the
	// user's, and neither the preloaded parent (real and saved uid its own)
	// nor the runner. nil without the thread; set before the first
	// request.
	killFromFileThread func() error
}

// proc is a started process.
type proc struct {
	pid    int
	done   chan struct{} // closed when status is set
	status syscall.WaitStatus
}

type forkReq struct {
	path  string
	argv  []string
	attr  *syscall.ProcAttr
	reply chan forkReply
}

type forkReply struct {
	pid  int
	proc *proc // with reapAll: the registered waiter
	err  error
}

func newProcs(cfg config) *procs {
	p := &procs{cfg: cfg, waiters: make(map[int]*proc), paths: make(map[string]string), forks: make(chan forkReq)}
	go p.forkThread()
	if cfg.reapAll {
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
func (p *procs) forkThread() {
	runtime.LockOSThread() // never unlocked: the thread ends with the process
	nnp := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
	for req := range p.forks {
		if nnp != nil {
			req.reply <- forkReply{err: fmt.Errorf("set no_new_privs: %w", nnp)}
			continue
		}
		var r forkReply
		if p.cfg.reapAll {
			// Registered before mu is released, so that reap finds the
			// waiter however soon the child ends.
			p.mu.Lock()
			r.pid, r.err = syscall.ForkExec(req.path, req.argv, req.attr)
			if r.err == nil {
				r.proc = newProcFor(r.pid)
				p.waiters[r.pid] = r.proc
			}
			p.mu.Unlock()
		} else {
			r.pid, r.err = syscall.ForkExec(req.path, req.argv, req.attr)
		}
		req.reply <- r
	}
}

func newProcFor(pid int) *proc { return &proc{pid: pid, done: make(chan struct{})} }

// alive reports whether the process has not been reaped yet.
func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// reap collects every exited child.
func (p *procs) reap() {
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

// spec describes a process to start as the user.
type spec struct {
	argv  []string
	env   []string
	files []*os.File // become fds 0, 1, 2, 3...; nil entries become /dev/null
	// parent starts a preloaded parent (see parent): in the user's group
	// but as uid 0, which it leaves before it imports anything.
	parent bool
}

// userFiles gives the pipes among files to the user, so that user code can
// also reach them by name (/dev/stdout, /dev/fd/3), which opens the pipe
// anew, and returns files with /dev/null for nil entries; the caller calls
// done once the process has them.
func (p *procs) userFiles(files []*os.File) (out []*os.File, done func(), err error) {
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
				if err := f.Chown(p.cfg.uid, p.cfg.gid); err != nil {
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

// start starts s as the user (when the runner is root) in a new process
// group led by the process, in the workspace.
func (p *procs) start(s spec) (*proc, error) {
	path, err := p.lookPath(s.argv[0])
	if err != nil {
		return nil, err
	}
	files, done, err := p.userFiles(s.files)
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
		uid := uint32(p.cfg.uid)
		if s.parent {
			uid = 0
		}
		sys.Credential = &syscall.Credential{Uid: uid, Gid: uint32(p.cfg.gid), Groups: []uint32{}}
	} else if s.parent {
		return nil, errors.New("a preloaded parent needs the runner to be root")
	}
	attr := &syscall.ProcAttr{Dir: p.cfg.workspace, Env: s.env, Files: fds, Sys: sys}

	reply := make(chan forkReply, 1)
	p.forks <- forkReq{path: path, argv: s.argv, attr: attr, reply: reply}
	r := <-reply
	if r.err != nil {
		return nil, fmt.Errorf("start %s: %w", s.argv[0], r.err)
	}
	if r.proc != nil {
		return r.proc, nil
	}
	pid := r.pid
	pr := newProcFor(pid)
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

func (p *procs) lookPath(name string) (string, error) {
	p.lookMu.Lock()
	defer p.lookMu.Unlock()
	if path, ok := p.paths[name]; ok {
		return path, nil
	}
	path := name
	if !strings.Contains(name, "/") {
		path = ""
		for _, dir := range filepath.SplitList(p.cfg.path) {
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

// exitCode is the shell's view of a wait status: the exit status, or 128+N
// for a process killed by signal N.
func exitCode(ws syscall.WaitStatus) int32 {
	switch {
	case ws.Exited():
		return int32(ws.ExitStatus())
	case ws.Signaled():
		return 128 + int32(ws.Signal())
	}
	return -1
}

// userProc is a process of the user found in /proc.
type userProc struct {
	pid, pgid int
}

// userProcs lists the live (not zombie) processes whose real, effective,
// saved or filesystem uid is the user's, except those in process group
// keepPgid (0: none).
func (p *procs) userProcs(keepPgid int) ([]userProc, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	self := os.Getpid()
	var out []userProc
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil || pid == self || pid == 1 {
			continue
		}
		st, ok := readProcStat(pid)
		if !ok || st.state == 'Z' || st.state == 'X' {
			continue
		}
		if !p.ownedByUser(pid) {
			continue
		}
		if keepPgid != 0 && st.pgid == keepPgid {
			continue
		}
		out = append(out, userProc{pid: pid, pgid: st.pgid})
	}
	return out, nil
}

type procStat struct {
	state byte
	pgid  int
}

// readProcStat parses the state and process group of /proc/pid/stat. The
// command name may hold spaces and parentheses, so fields are counted after
// the last ')'.
func readProcStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procStat{}, false
	}
	f := bytes.Fields(b[i+2:]) // state ppid pgrp ...
	if len(f) < 3 || len(f[0]) != 1 {
		return procStat{}, false
	}
	pgid, err := strconv.Atoi(string(f[2]))
	if err != nil {
		return procStat{}, false
	}
	return procStat{state: f[0][0], pgid: pgid}, true
}

func (p *procs) ownedByUser(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte("Uid:"))
		if !ok {
			continue
		}
		for i, f := range bytes.Fields(rest) {
			uid, err := strconv.Atoi(string(f))
			if i == 0 && err == nil && uid == wire.ParentUID && p.cfg.uid != wire.ParentUID {
				// The preloaded parent (real uid), not the user's.
				return false
			}
			if err == nil && uid == p.cfg.uid {
				return true
			}
		}
		return false
	}
	return false
}

// killUser kills every process of the user, except the process groups in
// keep, and waits until none is left. Processes that fork while they are
// being killed are caught by the next round.
func (p *procs) killUser(keep []int) error {
	keepPgid := 0
	if len(keep) > 0 {
		keepPgid = keep[0]
	}
	if p.cfg.reapAll {
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
		case keepPgid == 0 && p.killFromFileThread != nil:
			// As one pass of the kernel too, sparing the parent.
			if err := p.killFromFileThread(); err != nil {
				return err
			}
		default:
			_ = syscall.Kill(-1, syscall.SIGSTOP)
			defer syscall.Kill(-1, syscall.SIGCONT)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for round := 0; ; round++ {
		ps, err := p.userProcs(keepPgid)
		if err != nil {
			return err
		}
		if len(ps) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kill user processes: %d still alive after %d rounds", len(ps), round)
		}
		for _, up := range ps {
			if err := syscall.Kill(up.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("kill process %d: %w", up.pid, err)
			}
		}
		if round > 0 {
			time.Sleep(time.Duration(min(round, 20)) * time.Millisecond)
		}
	}
}

// killGroupBut kills every process of the user in process group pgid but
// process keep, and waits until they are gone.
func (p *procs) killGroupBut(pgid, keep int) error {
	deadline := time.Now().Add(5 * time.Second)
	for round := 0; ; round++ {
		ps, err := p.userProcs(0)
		if err != nil {
			return err
		}
		left := 0
		for _, up := range ps {
			if up.pgid != pgid || up.pid == keep {
				continue
			}
			left++
			if err := syscall.Kill(up.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("kill process %d: %w", up.pid, err)
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

// killGroup kills process group pgid.
func killGroup(pgid int) {
	if pgid > 1 {
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
}
