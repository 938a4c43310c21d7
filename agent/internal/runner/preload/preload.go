// Package preload is the preloaded parent of a sandbox: a Python
// interpreter that imports the libraries model-written code mostly uses and
// forks, on the runner's request, the prestarted interpreters of stateless
// runs and the kernels of sessions. See the runner's RATIONALE.md ("A
// preloaded parent for code that imports libraries").
package preload

import (
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/codemode-go/codemode/agent/internal/languages"
	"github.com/codemode-go/codemode/agent/internal/runner/proc"
	"github.com/codemode-go/codemode/agent/internal/runner/stdio"
	"github.com/codemode-go/codemode/agent/internal/wire"
)

// Parent is a preloaded parent: a Python interpreter, one per sandbox, that
// has imported the language's Preload modules (numpy, pandas, matplotlib,
// requests, scipy) and forks the prestarted interpreter of each stateless
// run (see the runner's prestarted interpreters), so that code importing
// them finds them imported: under gVisor `import pandas` alone costs about a
// second.
//
// What keeps runs apart is what keeps prestarted interpreters apart, plus:
//
//   - The parent never runs user code. It is started only in a sandbox just
//     verified clean (before Ready, or at the end of a Reset), imports only
//     from the image (the workspace is not on its sys.path while it
//     imports), and reads nothing but the runner's requests afterwards.
//   - Each child serves one run and dies with it, as a prestarted
//     interpreter does; the sweep and the scrub kill it like any process of
//     the user. The run ends when the child reports its exit code as it
//     exits (serveEnds), or when it is reaped; the Reset waits until it is
//     gone. The parent's memory is the child's copy: what a run changes
//     (monkeypatches, module globals, atexit hooks, sys.path, rcParams)
//     stays in that copy.
//   - The parent is out of the user's reach: its real and saved uid are
//     wire.ParentUID, so no process of the user may signal it, trace it or
//     read its memory (it is also not dumpable); the scrub spares it (its
//     kill(-1) as root stops every process instead of killing them all, and
//     processes whose real uid is the parent's are not the user's).
//   - It is replaced when it dies, and after the runner's -parent-forks
//     forks; when the sandbox image is rebuilt, the agent replaces the
//     whole sandbox, parent included (the agent's RATIONALE.md, "A rebuilt
//     sandbox image reaches the runs within seconds").
//
// A parent may fork a light parent (Start's light modules, numpy by
// default) once it has imported those, before the rest: code that imports
// nothing more is forked from it, whose children fork and end at less cost
// (its address space is smaller). It is the parent's child, with the same
// uids and the same guards, dies with it, and is made only with it; all
// the above holds of it.
//
// See zygote.py for the parent's side and what the child does before it
// reads any code.
type Parent struct {
	lang        string
	log         *slog.Logger
	forkTimeout time.Duration
	proc        *proc.Proc
	fd          int // the runner's end of the SOCK_SEQPACKET socket
	ends        *net.UnixListener
	modules     []string
	forks       int
	// light is the main parent's light parent, nil if it has none; names
	// is what the light parent's children find without importing more
	// (see languages.ImportsOnly).
	light   *Parent
	names   map[string]bool
	isLight bool

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
	Light   int               `json:"light"` // the light parent's pid
	Names   []string          `json:"names"`
}

// parentReadyTimeout bounds a parent's start with its imports: ~2 s on a
// quiet host of two CPUs, and past 8 s with the host saturated by other
// sandboxes (the imports cost 4-7 s of CPU under runsc). A parent given up
// is work thrown away that the next Reset starts again, so the bound is
// for a parent that will not get ready at all, not a slow one; within the
// agent's bounds on a whole Reset and on a sandbox's start
// (pool.DefaultResetTimeout, pool.DefaultStartTimeout).
const parentReadyTimeout = 20 * time.Second

// envNames returns the names of env's NAME=value entries.
func envNames(env []string) []string {
	names := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		names = append(names, name)
	}
	return names
}

// parentEnv is lang's ParentEnv less an LD_PRELOAD of a library the image
// lacks (one not built by agent/host/setup.sh), which the dynamic linker
// would only complain of: the parent then starts without it, and the log
// says so.
func parentEnv(lang languages.Language, log *slog.Logger) []string {
	return slices.DeleteFunc(slices.Clone(lang.ParentEnv), func(kv string) bool {
		lib, ok := strings.CutPrefix(kv, "LD_PRELOAD=")
		if !ok {
			return false
		}
		if _, err := os.Stat(lib); err != nil {
			log.Warn("preloaded parent: the image lacks a library of its settings; started without it", "lang", lang.Name, "library", lib, "error", err)
			return true
		}
		return false
	})
}

// Config says how a parent is started.
type Config struct {
	UID, GID  int    // the user's
	Workspace string // the children's working directory
	Env       []string
	// ForkTimeout bounds the wait for the parent's answer to a fork.
	ForkTimeout time.Duration
	Log         *slog.Logger
}

// Start starts lang's preloaded parent with procs, importing modules, and
// waits until it is ready. With light (modules among modules, imported
// first), the parent forks a light parent once it has imported them, which
// holds them alone (Light). Only in a clean sandbox (see Parent).
func Start(procs *proc.Table, lang languages.Language, modules, light []string, c Config) (*Parent, error) {
	z := &Parent{lang: lang.Name, log: c.Log, forkTimeout: c.ForkTimeout, kids: make(map[int]*proc.Proc)}
	var lz *Parent
	files := []*os.File{nil, nil, nil}
	defer func() { stdio.CloseAll(files...) }()
	endName, child, err := z.open()
	if err != nil {
		return nil, err
	}
	files = append(files, child)
	var lightCfg map[string]any
	if len(light) > 0 {
		lz = &Parent{lang: lang.Name, log: c.Log, forkTimeout: c.ForkTimeout, kids: make(map[int]*proc.Proc), isLight: true}
		name, lchild, err := lz.open()
		if err != nil {
			z.close()
			return nil, err
		}
		files = append(files, lchild)
		lightCfg = map[string]any{"modules": light, "end": name}
	}
	cleanup := func() {
		z.close()
		if lz != nil {
			lz.close()
		}
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("create pipe: %w", err)
	}
	files[2] = errW
	p, err := procs.Start(proc.Spec{Argv: lang.Parent, Env: slices.Concat(c.Env, parentEnv(lang, c.Log)), Files: files, Parent: true})
	if err != nil {
		errR.Close()
		cleanup()
		return nil, err
	}
	z.proc = p
	go z.logStderr(errR)
	go z.serveEnds()
	cfg, err := json.Marshal(map[string]any{
		"uid": c.UID, "gid": c.GID, "parent_uid": wire.ParentUID,
		"workspace": c.Workspace, "modules": modules, "prestart": lang.Prestart[len(lang.Prestart)-1], "kernel": KernelSource(lang),
		"end": endName, "light": lightCfg, "unset": envNames(lang.ParentEnv),
	})
	if err == nil {
		err = z.send(cfg, nil)
	}
	if err != nil {
		z.Kill()
		if lz != nil {
			lz.close()
		}
		return nil, fmt.Errorf("configure: %w", err)
	}
	t0 := time.Now()
	m, err := z.awaitReady(time.After(parentReadyTimeout))
	if err != nil {
		if lz != nil {
			lz.close()
		}
		return nil, err
	}
	z.modules = m.Modules
	if len(m.Skipped) > 0 {
		c.Log.Warn("preloaded parent: modules skipped", "lang", lang.Name, "skipped", m.Skipped)
	}
	c.Log.Debug("preloaded parent ready", "lang", lang.Name, "pid", p.Pid, "modules", m.Modules, "light", m.Light, "took", time.Since(t0))
	if lz != nil && m.Light > 0 {
		z.mu.Lock()
		lz.proc = z.kids[m.Light]
		z.mu.Unlock()
		go lz.serveEnds()
		lm, err := lz.awaitReady(time.After(c.ForkTimeout))
		if err == nil {
			lz.modules, lz.names = lm.Modules, make(map[string]bool, len(lm.Names))
			for _, n := range lm.Names {
				lz.names[n] = true
			}
			z.light = lz
			return z, nil
		}
		c.Log.Warn("light preloaded parent not ready; its code is forked from the parent", "lang", lang.Name, "error", err)
	} else if lz != nil {
		lz.close()
	}
	return z, nil
}

// open makes the parent's socket and its end-report listener, and returns
// the listener's name and the parent's end of the socket.
func (z *Parent) open() (endName string, child *os.File, err error) {
	z.ends, endName, err = listenEnds()
	if err != nil {
		return "", nil, err
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		z.ends.Close()
		return "", nil, fmt.Errorf("create socket: %w", err)
	}
	z.fd = fds[0]
	z.replies = make(chan parentReply, 1)
	z.ended = make(chan struct{})
	return endName, os.NewFile(uintptr(fds[1]), "parent-socket"), nil
}

// close closes what open made, for a parent never started or gone.
func (z *Parent) close() {
	unix.Close(z.fd)
	z.ends.Close()
}

// awaitReady serves the parent's messages and waits for its first: that
// it is ready. It kills the parent if it ends first or timeout comes.
func (z *Parent) awaitReady(timeout <-chan time.Time) (parentMsg, error) {
	ready := make(chan parentMsg, 1)
	go z.read(ready)
	select {
	case m := <-ready:
		return m, nil
	case <-z.ended:
		z.Kill()
		return parentMsg{}, errors.New("preloaded parent ended before it was ready (see its log)")
	case <-timeout:
		z.Kill()
		return parentMsg{}, errors.New("preloaded parent not ready in time")
	}
}

// logStderr logs what the parent writes to its standard error (import
// warnings, or why it failed).
func (z *Parent) logStderr(r *os.File) {
	defer r.Close()
	b := make([]byte, 4096)
	for {
		n, err := r.Read(b)
		if n > 0 {
			z.log.Warn("preloaded parent", "pid", z.proc.Pid, "stderr", strings.TrimSpace(string(b[:n])))
		}
		if err != nil {
			return
		}
	}
}

func (z *Parent) send(b []byte, files []*os.File) error {
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
func (z *Parent) read(ready chan<- parentMsg) {
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
			if m.Light > 0 {
				// Known as a child before any exit of its is read.
				z.mu.Lock()
				z.kids[m.Light] = proc.Forked(m.Light)
				z.mu.Unlock()
			}
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

// endReadTimeout bounds the wait for a child's report once it has
// connected: it connects only to send it.
const endReadTimeout = 200 * time.Millisecond

// listenEnds listens on a new abstract socket for the children's end
// reports (serveEnds), and returns it and its name without the leading NUL.
func listenEnds() (*net.UnixListener, string, error) {
	name := "codemode-end-" + rand.Text()
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: "@" + name, Net: "unixpacket"})
	if err == nil {
		if err = passCred(l); err != nil {
			l.Close()
		}
	}
	if err != nil {
		return nil, "", fmt.Errorf("listen for end reports: %w", err)
	}
	return l, name, nil
}

// serveEnds takes the end reports of the parent's children until the
// parent is killed. A prestarted interpreter's last act before it exits
// (zygote.py's _report_end) is to connect to this socket (abstract, named
// in the parent's settings) and send its exit code, one byte, after it has
// closed its standard output and error. Under gVisor its parent learns
// that it ended, and so the runner, tens of milliseconds later: the address
// space it shares with the parent is released first (the runner's
// RATIONALE, "What is left of a forked run's end"). Any process may
// connect, but a report is taken only from one of the parent's children,
// by the credentials the kernel attaches to it (SCM_CREDENTIALS). A report
// a run's code sends itself ends only its own run early; the sweep then
// kills it as it would have at the run's end.
func (z *Parent) serveEnds() {
	for {
		c, err := z.ends.AcceptUnix()
		if err != nil {
			return
		}
		z.takeEnd(c)
	}
}

// takeEnd reads one end report from c, with its sender's credentials: the
// kernel's, not the sender's word (SO_PEERCRED would do without a message,
// but gVisor answers it with the listener's own credentials).
func (z *Parent) takeEnd(c *net.UnixConn) {
	defer c.Close()
	if err := passCred(c); err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(endReadTimeout))
	var b [1]byte
	oob := make([]byte, unix.CmsgSpace(unix.SizeofUcred))
	n, oobn, _, _, err := c.ReadMsgUnix(b[:], oob)
	if err != nil || n != 1 {
		return
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return
	}
	cred, err := unix.ParseUnixCredentials(&msgs[0])
	if err != nil {
		return
	}
	z.mu.Lock()
	k := z.kids[int(cred.Pid)]
	z.mu.Unlock()
	if k != nil {
		k.Report(int32(b[0]))
	}
}

// passCred has the kernel attach their senders' credentials to the
// messages c receives (SO_PASSCRED): set on the listener, before the
// children connect, for gVisor to attach them.
func passCred(c syscall.Conn) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PASSCRED, 1)
	}); err != nil {
		return err
	}
	return serr
}

// ForkInterpreter has the parent fork a prestarted interpreter with files
// as its fds 0-4.
func (z *Parent) ForkInterpreter(files []*os.File) (*proc.Proc, error) {
	return z.fork("fork", files)
}

// ForkKernel has the parent fork a session's kernel with files as its fds
// 0-3.
func (z *Parent) ForkKernel(files []*os.File) (*proc.Proc, error) {
	return z.fork("kernel", files)
}

// fork has the parent fork an interpreter with files as its fds: kind
// "fork" a prestarted interpreter (fds 0-4), "kernel" a session's kernel
// (fds 0-3).
func (z *Parent) fork(kind string, files []*os.File) (*proc.Proc, error) {
	z.forks++
	if err := z.send([]byte(kind), files); err != nil {
		return nil, fmt.Errorf("ask preloaded parent to fork: %w", err)
	}
	select {
	case r := <-z.replies:
		return r.proc, r.err
	case <-z.ended:
		return nil, errors.New("preloaded parent ended")
	case <-time.After(z.forkTimeout):
		return nil, errors.New("preloaded parent did not fork in time")
	}
}

// Lang is the language of the parent.
func (z *Parent) Lang() string { return z.lang }

// Modules are the modules the parent imported.
func (z *Parent) Modules() []string { return z.modules }

// Forks is how many interpreters the parent and its light parent were
// asked to fork.
func (z *Parent) Forks() int {
	if z.light != nil {
		return z.forks + z.light.forks
	}
	return z.forks
}

// Light is the parent's light parent, nil if it has none.
func (z *Parent) Light() *Parent { return z.light }

// Names says what the light parent's children find imported or in the
// standard library: code that imports nothing else may be forked from it
// (languages.ImportsOnly). Nil for a main parent.
func (z *Parent) Names() map[string]bool { return z.names }

// Alive reports whether the parent can still fork.
func (z *Parent) Alive() bool {
	select {
	case <-z.ended:
		return false
	default:
		return z.proc.Alive() && !proc.Exited(z.proc.Pid)
	}
}

// Kill ends the parent (its children die with it, its light parent too)
// and waits until it is gone.
func (z *Parent) Kill() {
	if z.isLight {
		// A light parent, in its parent's process group; once its end is
		// known (reaped by the parent, or the parent gone) its pid is
		// not signalled again.
		if z.proc.Alive() {
			_ = syscall.Kill(z.proc.Pid, syscall.SIGKILL)
		}
	} else {
		proc.KillGroup(z.proc.Pid)
	}
	select {
	case <-z.proc.Done():
	case <-time.After(5 * time.Second):
	}
	unix.Shutdown(z.fd, unix.SHUT_RDWR)
	<-z.ended
	z.close()
	if z.light != nil {
		z.light.Kill()
	}
}

// KernelSource is the source of lang's session kernel, "" if it has none.
func KernelSource(lang languages.Language) string {
	if len(lang.Kernel) == 0 {
		return ""
	}
	return lang.Kernel[len(lang.Kernel)-1]
}
