package runner

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/codemode-go/codemode/agent/internal/runner/proc"
	"github.com/codemode-go/codemode/agent/internal/runner/stdio"
	"github.com/codemode-go/codemode/agent/internal/wire"
)

// A preloaded parent is a Python interpreter, one per sandbox, that has
// imported the language's Preload modules (numpy, pandas, matplotlib,
// requests, scipy) and forks the prestarted interpreter of each stateless
// run (see prestarted), so that code importing them finds them imported:
// under gVisor `import pandas` alone costs about a second.
//
// What keeps runs apart is what keeps prestarted interpreters apart, plus:
//
//   - The parent never runs user code. It is started only in a sandbox just
//     verified clean (before Ready, or at the end of a Reset), imports only
//     from the image (the workspace is not on its sys.path while it
//     imports), and reads nothing but the runner's requests afterwards.
//   - Each child serves one run and dies with it, as a prestarted
//     interpreter does; the sweep and the scrub kill it like any process of
//     the user. The parent's memory is the child's copy: what a run changes
//     (monkeypatches, module globals, atexit hooks, sys.path, rcParams)
//     stays in that copy.
//   - The parent is out of the user's reach: its real and saved uid are
//     wire.ParentUID, so no process of the user may signal it, trace it or
//     read its memory (it is also not dumpable); the scrub spares it (its
//     kill(-1) as root stops every process instead of killing them all, and
//     processes whose real uid is the parent's are not the user's).
//   - It is replaced when it dies, and after cfg.parentForks forks.
//
// See zygote.py for the parent's side and what the child does before it
// reads any code.
type parent struct {
	lang    string
	proc    *proc.Proc
	fd      int // the runner's end of the SOCK_SEQPACKET socket
	modules []string
	forks   int

	sendMu  sync.Mutex
	mu      sync.Mutex
	kids    map[int]*proc.Proc // forked, not yet reported ended
	replies chan parentReply
	ended   chan struct{} // closed when the socket ends (the parent is gone)
}

type parentReply struct {
	proc *proc.Proc
	err  error
}

// parentMsg is one message of the parent (see zygote.py).
type parentMsg struct {
	Ready   bool              `json:"ready"`
	Modules []string          `json:"modules"`
	Skipped map[string]string `json:"skipped"`
	Pid     int               `json:"pid"`
	Exit    int               `json:"exit"`
	Status  int               `json:"status"`
	Error   string            `json:"error"`
}

// parentReadyTimeout bounds a parent's start with its imports (~2 s on a
// quiet host): within the agent's bound on a Reset (10 s).
const parentReadyTimeout = 8 * time.Second

// startParent starts lang's preloaded parent, importing modules, and waits
// until it is ready. Only in a clean sandbox (see parent).
func (s *server) startParent(lang language, modules []string) (*parent, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("create socket: %w", err)
	}
	child := os.NewFile(uintptr(fds[1]), "parent-socket")
	errR, errW, err := os.Pipe()
	if err != nil {
		child.Close()
		unix.Close(fds[0])
		return nil, fmt.Errorf("create pipe: %w", err)
	}
	p, err := s.procs.Start(proc.Spec{Argv: lang.Parent, Env: s.env(lang), Files: []*os.File{nil, nil, errW, child}, Parent: true})
	stdio.CloseAll(child, errW)
	if err != nil {
		errR.Close()
		unix.Close(fds[0])
		return nil, err
	}
	z := &parent{lang: lang.Name, proc: p, fd: fds[0], kids: make(map[int]*proc.Proc), replies: make(chan parentReply, 1), ended: make(chan struct{})}
	go s.logParent(errR, p.Pid)
	cfg, err := json.Marshal(map[string]any{
		"uid": s.cfg.uid, "gid": s.cfg.gid, "parent_uid": wire.ParentUID,
		"workspace": s.cfg.workspace, "modules": modules, "prestart": lang.Prestart[len(lang.Prestart)-1], "kernel": kernelSource(lang),
	})
	if err == nil {
		err = z.send(cfg, nil)
	}
	if err != nil {
		z.kill()
		return nil, fmt.Errorf("configure: %w", err)
	}
	ready := make(chan parentMsg, 1)
	go z.read(ready)
	select {
	case m := <-ready:
		z.modules = m.Modules
		if len(m.Skipped) > 0 {
			s.cfg.log.Warn("preloaded parent: modules skipped", "lang", lang.Name, "skipped", m.Skipped)
		}
		s.cfg.log.Debug("preloaded parent ready", "lang", lang.Name, "pid", p.Pid, "modules", m.Modules)
		return z, nil
	case <-z.ended:
		z.kill()
		return nil, errors.New("preloaded parent ended before it was ready (see its log)")
	case <-time.After(parentReadyTimeout):
		z.kill()
		return nil, fmt.Errorf("preloaded parent not ready after %v", parentReadyTimeout)
	}
}

// logParent logs what the parent writes to its standard error (import
// warnings, or why it failed).
func (s *server) logParent(r *os.File, pid int) {
	defer r.Close()
	b := make([]byte, 4096)
	for {
		n, err := r.Read(b)
		if n > 0 {
			s.cfg.log.Warn("preloaded parent", "pid", pid, "stderr", strings.TrimSpace(string(b[:n])))
		}
		if err != nil {
			return
		}
	}
}

func (z *parent) send(b []byte, files []*os.File) error {
	z.sendMu.Lock()
	defer z.sendMu.Unlock()
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	for {
		err := unix.Sendmsg(z.fd, b, oob, nil, 0)
		if err != unix.EINTR {
			return err
		}
	}
}

// read serves the parent's messages until its socket ends: the first
// (ready) to ready, fork replies to replies, and the exit statuses of its
// children to their waiters. When the parent is gone its children die too
// (PR_SET_PDEATHSIG); those not reported yet are reported killed.
func (z *parent) read(ready chan<- parentMsg) {
	defer func() {
		z.mu.Lock()
		for pid, k := range z.kids {
			k.Finish(syscall.WaitStatus(syscall.SIGKILL))
			delete(z.kids, pid)
		}
		z.mu.Unlock()
		close(z.ended)
	}()
	b := make([]byte, 64<<10)
	for {
		n, err := unix.Read(z.fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return
		}
		var m parentMsg
		if err := json.Unmarshal(b[:n], &m); err != nil {
			return
		}
		switch {
		case m.Ready:
			ready <- m
		case m.Pid > 0:
			k := proc.Forked(m.Pid)
			z.mu.Lock()
			z.kids[m.Pid] = k
			z.mu.Unlock()
			z.replies <- parentReply{proc: k}
		case m.Exit > 0:
			z.mu.Lock()
			k := z.kids[m.Exit]
			delete(z.kids, m.Exit)
			z.mu.Unlock()
			if k != nil {
				k.Finish(syscall.WaitStatus(m.Status))
			}
		case m.Error != "":
			z.replies <- parentReply{err: errors.New(m.Error)}
		}
	}
}

// fork has the parent fork an interpreter with files as its fds: kind
// "fork" a prestarted interpreter (fds 0-4), "kernel" a session's kernel
// (fds 0-3).
func (z *parent) fork(kind string, files []*os.File) (*proc.Proc, error) {
	z.forks++
	if err := z.send([]byte(kind), files); err != nil {
		return nil, fmt.Errorf("ask preloaded parent to fork: %w", err)
	}
	select {
	case r := <-z.replies:
		return r.proc, r.err
	case <-z.ended:
		return nil, errors.New("preloaded parent ended")
	case <-time.After(prestartReadyTimeout):
		return nil, errors.New("preloaded parent did not fork in time")
	}
}

// alive reports whether the parent can still fork.
func (z *parent) alive() bool {
	select {
	case <-z.ended:
		return false
	default:
		return z.proc.Alive()
	}
}

// kill ends the parent (its children die with it) and waits until it is
// gone.
func (z *parent) kill() {
	proc.KillGroup(z.proc.Pid)
	select {
	case <-z.proc.Done():
	case <-time.After(5 * time.Second):
	}
	unix.Shutdown(z.fd, unix.SHUT_RDWR)
	<-z.ended
	unix.Close(z.fd)
}

// preloadedParent returns lang's parent, started or replaced if need be, or
// nil when lang has none or preloading is off. Called with prestartMu held,
// in a clean sandbox.
func (s *server) preloadedParent(lang language) *parent {
	if lang.Parent == nil || lang.Prestart == nil || len(s.cfg.preload) == 0 || s.parentFailures >= maxPrestartFailures {
		return nil
	}
	if z := s.parent; z != nil {
		if z.lang == lang.Name && z.alive() && z.forks < s.cfg.parentForks {
			return z
		}
		s.dropParent()
	}
	z, err := s.startParent(lang, s.cfg.preload)
	if err != nil {
		s.parentFailures++
		s.cfg.log.Warn("start preloaded parent", "lang", lang.Name, "failures", s.parentFailures, "error", err)
		return nil
	}
	s.parentFailures = 0
	s.parent = z
	s.procs.SetSparing(true)
	return z
}

// dropParent ends the parent, if there is one. Called with prestartMu held.
func (s *server) dropParent() {
	if s.parent == nil {
		return
	}
	s.parent.kill()
	s.parent = nil
	s.procs.SetSparing(false)
}

// Preloaded returns the modules the parent of lang imported, nil if there
// is none.
func (s *server) preloaded(lang string) []string {
	s.prestartMu.Lock()
	defer s.prestartMu.Unlock()
	if s.parent == nil || s.parent.lang != lang {
		return nil
	}
	return s.parent.modules
}

// kernelSource is the source of lang's session kernel, "" if it has none.
func kernelSource(lang language) string {
	if len(lang.Kernel) == 0 {
		return ""
	}
	return lang.Kernel[len(lang.Kernel)-1]
}

// forkKernel forks a session's kernel from lang's preloaded parent, if
// there is one that may still fork (a parent is started or replaced only in
// a clean sandbox, by a Reset), with files as its fds 0-3.
func (s *server) forkKernel(lang language, files []*os.File) (*proc.Proc, bool) {
	s.prestartMu.Lock()
	defer s.prestartMu.Unlock()
	z := s.parent
	if z == nil || z.lang != lang.Name || !z.alive() || z.forks >= s.cfg.parentForks || kernelSource(lang) == "" {
		return nil, false
	}
	fs, done, err := s.procs.UserFiles(files)
	if err == nil {
		var p *proc.Proc
		p, err = z.fork("kernel", fs)
		done()
		if err == nil {
			return p, true
		}
	}
	s.cfg.log.Warn("fork kernel from preloaded parent", "lang", lang.Name, "error", err)
	s.dropParent()
	return nil, false
}

// parentAlive says whether lang's parent lives and may fork again. Called
// with prestartMu held.
func (s *server) parentAlive(lang language) bool {
	z := s.parent
	return z != nil && z.lang == lang.Name && z.alive() && z.forks < s.cfg.parentForks
}

// namesModule says whether code names one of modules' top-level packages as
// a word ("import pandas as pd", "from matplotlib import pyplot"): a guess,
// made before the code runs, of whether it imports them. A wrong guess
// costs time, not isolation.
func namesModule(code string, modules []string) bool {
	for _, m := range modules {
		top, _, _ := strings.Cut(m, ".")
		for i := 0; ; {
			j := strings.Index(code[i:], top)
			if j < 0 {
				break
			}
			j += i
			end := j + len(top)
			if (j == 0 || !identByte(code[j-1])) && (end == len(code) || !identByte(code[end])) {
				return true
			}
			i = end
		}
	}
	return false
}

func identByte(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
