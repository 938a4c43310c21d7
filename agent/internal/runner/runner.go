// Package runner is the resident process of every sandbox: the entry process
// of the container, started by the agent with the container's stdin and
// stdout attached. It reads [runnerv1.Request] frames from stdin and answers
// with [runnerv1.Event] frames on stdout (see package wire for the framing and
// the protocol); its own log goes to stderr.
//
// The runner runs as root with a handful of capabilities (wire.RunnerCapabilities)
// and starts user code as wire.UserUID with none, in its own process group,
// with a clean environment, in /workspace. It streams the program's output as
// it is produced, caps it, enforces the run's timeout by killing the process
// group and every other process of the user, keeps stateful interpreters
// (a Python kernel, a shell's working directory, variables and functions)
// for sessions, serves file requests confined to /workspace, and scrubs the
// sandbox for reuse (Reset). See RATIONALE.md for the decisions behind it.
//
// The pieces with names of their own are packages below this one: proc
// (starting and killing the user's processes), asuser (acting as the user
// from the runner's threads), files (the file requests), artifacts, ipc
// (removing IPC objects at Reset), stdio (pipes and output), egressproxy and
// preload (the preloaded parent). This package serves the requests and
// keeps the sandbox's state between them.
package runner

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/agent/internal/languages"
	"github.com/codemode-go/codemode/agent/internal/runner/asuser"
	"github.com/codemode-go/codemode/agent/internal/runner/egressproxy"
	"github.com/codemode-go/codemode/agent/internal/runner/files"
	"github.com/codemode-go/codemode/agent/internal/runner/ipc"
	"github.com/codemode-go/codemode/agent/internal/runner/preload"
	"github.com/codemode-go/codemode/agent/internal/runner/proc"
	"github.com/codemode-go/codemode/agent/internal/runner/stdio"
	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	runlimits "github.com/codemode-go/codemode/internal/limits"
)

// Defaults for a Run that leaves a limit at zero, and the ceiling a Run
// cannot raise, from the system's one source (package limits). The agent
// sets every limit of a Run; these bound what the runner is asked for.
const (
	DefaultTimeout     = runlimits.DefaultTimeout
	MaxTimeout         = runlimits.TimeoutCeiling
	DefaultOutputLimit = runlimits.DefaultOutputBytes
)

// config is the runner's configuration. Run fills it for the real sandbox;
// tests point the directories at temporary ones and pick their own uid.
type config struct {
	workspace string   // working directory of user code; file paths are relative to it
	scratch   []string // other writable places that Reset empties
	uid, gid  int      // user code runs as these (if the runner is root)
	// reapAll makes the runner wait for every child, adopted orphans
	// included, as an init process must. Off in tests, where the runner
	// shares its process with the test binary and its other children.
	reapAll bool
	// cgroupMemory is the sandbox's memory cgroup directory (gVisor mounts
	// cgroup v1); "" disables the memory watchdog.
	cgroupMemory string
	// meminfo is /proc/meminfo, which the memory watchdog reads between
	// its reads of the cgroup where the two agree (see memoryFiles); "":
	// only the cgroup.
	meminfo string
	// cgroupCPU is the sandbox's cpu cgroup directory, whose quota sizes
	// the numerical libraries' threads (see threadEnv).
	cgroupCPU string
	path      string // PATH of user code
	// userProcs caps the processes (and threads) of the user, as
	// RLIMIT_NPROC; 0: no cap. Under gVisor a container's pids limit
	// counts the sandbox kernel's host threads and processes, not the
	// sandbox's own, and a fork bomb that drives the sandbox kernel into
	// it kills the whole sandbox; this cap stops the bomb inside first.
	userProcs uint64
	log       *slog.Logger
	// drainGrace is how long a run's output is still awaited after its
	// main process ended (background processes may hold the pipes open).
	drainGrace time.Duration
	// prestart starts an interpreter ahead of the next stateless run (see
	// prestarted).
	prestart bool
	// preload are the modules a preloaded parent imports for the
	// prestarted interpreters of its language (see package preload);
	// none: no parent. parentForks is how many interpreters a parent forks before
	// it is replaced.
	preload     []string
	parentForks int
	// lightParent has the parent fork a light parent that holds only the
	// languages table's PreloadLight modules (see package preload).
	lightParent bool
	// preloadStart starts the parent when the sandbox starts; otherwise
	// only after a stateless run that named a preloaded module (see
	// parentWanted).
	preloadStart bool
	// versions makes the runner ask each language for its version before
	// it says it is ready (see versions).
	versions bool
	// self is the runner's binary, started as the helper that opens the
	// message queues (see ipc.OpenMqueues); "": no helper (tests, where the
	// binary is the test's).
	self string
	// lib is the directory for the modules the runner lends user code
	// (see prepareLib); "" or missing: none.
	lib string
	// mplSeed is where the image keeps matplotlib's font list (see
	// mplConfig); missing: none.
	mplSeed string
	// proxyAddrs are where the egress proxy listens (see package
	// egressproxy); none: no proxy, and user code has no way out at all.
	proxyAddrs []string
}

func defaultConfig(log *slog.Logger) config {
	return config{
		workspace:    wire.Workspace,
		scratch:      []string{"/tmp", "/dev/shm"},
		uid:          wire.UserUID,
		gid:          wire.UserGID,
		reapAll:      os.Getpid() == 1,
		cgroupMemory: "/sys/fs/cgroup/memory",
		meminfo:      "/proc/meminfo",
		cgroupCPU:    "/sys/fs/cgroup/cpu",
		path:         "/usr/local/bin:/usr/bin:/bin",
		log:          log,
		drainGrace:   100 * time.Millisecond,
		prestart:     true,
		parentForks:  100,
		preloadStart: true,
		lightParent:  true,
		versions:     true,
		lib:          wire.UserLib,
		mplSeed:      MPLSeed,
		proxyAddrs:   []string{fmt.Sprintf("127.0.0.1:%d", wire.ProxyPort), fmt.Sprintf("[::1]:%d", wire.ProxyPort)},
	}
}

// Run is the runner's main: it serves requests from stdin until stdin ends
// or ctx is done, then kills every user process. args are the command-line
// flags (see -help); the single argument "mount-mqueue" makes the process
// the runner's own helper instead (see ipc.OpenMqueues).
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 1 && args[0] == ipc.MqueueHelperArg {
		return ipc.RunMqueueHelper()
	}
	fs := flag.NewFlagSet("runner", flag.ContinueOnError)
	fs.SetOutput(stderr)
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	workspace := fs.String("workspace", wire.Workspace, "working directory of user code")
	scratch := fs.String("scratch", "/tmp,/dev/shm", "comma-separated writable directories that Reset empties besides the workspace")
	userProcs := fs.Uint64("max-user-procs", 32, "most processes and threads user code may have at once (RLIMIT_NPROC); 0: no limit")
	versions := fs.Bool("versions", true, "report the languages' versions when ready (a process per language)")
	prestart := fs.Bool("prestart", true, "start an interpreter ahead of the next stateless run, in the language of the last one (Python at first)")
	preload := fs.String("preload", "", "comma-separated modules a preloaded parent imports before it forks each prestarted Python interpreter (\"default\": the languages table's list); empty: none, each interpreter starts fresh")
	parentForks := fs.Int("parent-forks", 100, "interpreters a preloaded parent forks before it is replaced")
	lightParent := fs.Bool("light-parent", true, "beside the preloaded parent, a light parent holding only the languages table's PreloadLight modules, for code that imports nothing else but the standard library: its interpreters fork and end at less cost")
	preloadStart := fs.Bool("preload-start", true, "start the preloaded parent with the sandbox; false: only after the first stateless run that names a preloaded module (a sandbox whose runs import nothing then never pays for it)")
	lib := fs.String("lib", wire.UserLib, "root-only directory for the modules lent to user code (matplotlib's plt.show() saving figures as artifacts, Node's fetch through the egress proxy); skipped if missing")
	proxy := fs.Bool("egress-proxy", true, fmt.Sprintf("serve the egress proxy on the sandbox's loopback, port %d", wire.ProxyPort))
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: runner [flags]\n\nThe codemode sandbox runner: framed requests on stdin, framed events on stdout.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		return fmt.Errorf("parse -log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lv})).With("component", "runner")

	cfg := defaultConfig(log)
	cfg.workspace = *workspace
	cfg.userProcs = *userProcs
	cfg.prestart = *prestart
	cfg.preload = languages.PreloadList(*preload)
	cfg.parentForks = max(*parentForks, 1)
	cfg.preloadStart = *preloadStart
	cfg.lightParent = *lightParent
	cfg.versions = *versions
	cfg.lib = *lib
	if !*proxy {
		cfg.proxyAddrs = nil
	}
	cfg.self = "/proc/self/exe"
	cfg.scratch = nil
	for _, d := range strings.Split(*scratch, ",") {
		if d = strings.TrimSpace(d); d != "" {
			cfg.scratch = append(cfg.scratch, d)
		}
	}
	if err := harden(cfg); err != nil {
		return err
	}
	s, err := newServer(cfg, stdout)
	if err != nil {
		return err
	}
	return s.serve(ctx, stdin)
}

// harden sets up the runner process itself: not dumpable (so not
// traceable and its memory not readable even by a process of its own uid), no
// core files, and a cap on the user's processes below the sandbox's pids
// limit, so that a fork bomb leaves the runner room to work. (no_new_privs
// is set on the thread that starts user code: see package proc.)
func harden(cfg config) error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("clear dumpable: %w", err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		cfg.log.Warn("set RLIMIT_CORE", "error", err)
	}
	n := cfg.userProcs
	if b, err := os.ReadFile("/sys/fs/cgroup/pids/pids.max"); err == nil {
		if max, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			// Leave room for the runner's own threads.
			n = min(n, max-min(max/2, 16))
		}
	}
	if n > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_NPROC, &unix.Rlimit{Cur: n, Max: n}); err != nil {
			cfg.log.Warn("set RLIMIT_NPROC", "error", err)
		} else {
			cfg.log.Debug("user process limit", "nproc", n)
		}
	}
	return nil
}

// server serves the requests of one stream.
type server struct {
	cfg   config
	out   *stdio.Writer
	procs *proc.Table
	files *files.Workspace
	// fileThread runs file requests as the user (see files); nil if the
	// runner is not root.
	fileThread *asuser.FileThread

	mu     sync.Mutex
	active uint64             // id of the request being served, 0 if none
	cancel context.CancelFunc // cancels the active run

	// Stateful interpreters; touched only by the request being served.
	kernel *kernel                // Python, nil until the first stateful Python run
	shells map[string]*shellState // by language

	// userEnv is added to the environment of all user code (see
	// prepareLib and proxyEnv).
	userEnv []string
	// proxy serves the runs' egress; nil if there is none.
	proxy *egressproxy.Proxy

	mpl      *mplConfig  // nil without a lib directory; touched only by Reset
	ipcFloor ipc.Floor   // touched only by Reset
	mqueues  *os.File    // see ipc.OpenMqueues; nil if it failed, and then Reset fails
	mqErr    error       // why mqueues is nil
	memory   memoryFiles // for the memory watchdog

	// The prestarted interpreter; the lock lets tests look at it while
	// requests are served.
	prestartMu   sync.Mutex
	pre          *prestarted
	prestartLang string // language of the next prestart; "": none
	// Prestarts that failed in a row; at maxPrestartFailures prestarting
	// is off for good.
	prestartFailures int
	// The preloaded parent (see package preload), under prestartMu;
	// parent starts that failed in a row.
	parent         *preload.Parent
	parentFailures int
	// Interpreters forked from a parent that did not get ready, in a row
	// (see prestartOne); at maxPrestartFailures no parent is started.
	forkFailures int
	// parentWanted: a parent is started (or replaced) at the next Reset.
	// Set from the start with config.preloadStart, else by the first
	// stateless run that names a preloaded module; never unset, so a
	// sandbox's parent, once started, is kept and replaced as need be.
	parentWanted bool
	// What the next prestarted interpreter is forked from: what the last
	// stateless run wanted (a fresh one at first: code that imports
	// nothing is the most common).
	prestartFrom parentKind
}

func newServer(cfg config, stdout io.Writer) (*server, error) {
	if err := prepareDirs(cfg); err != nil {
		return nil, err
	}
	userEnv, lib, err := prepareLib(cfg)
	if err != nil {
		return nil, err
	}
	userEnv = append(userEnv, threadEnv(cfg.cgroupCPU, runtime.NumCPU())...)
	// Before proc.New starts the reaper, which would take the exit status
	// of the helper this may start.
	mq, mqErr := openMqueues(cfg)
	thread, ws, err := openFiles(cfg)
	if err != nil {
		if mq != nil {
			mq.Close()
		}
		return nil, err
	}
	s := &server{
		cfg:        cfg,
		out:        stdio.NewWriter(stdout),
		procs:      proc.New(procConfig(cfg, thread)),
		files:      ws,
		fileThread: thread,
		shells:     make(map[string]*shellState),
		memory:     openMemoryFiles(cfg.cgroupMemory, cfg.meminfo),
		userEnv:    userEnv,

		mqueues: mq,
		mqErr:   mqErr,

		parentWanted: cfg.preloadStart,
	}
	if s.memory.usage != nil && s.memory.meminfo == nil && cfg.meminfo != "" {
		cfg.log.Warn(meminfoUnusable, "meminfo", cfg.meminfo)
	}
	if cfg.prestart {
		s.prestartLang = languages.Default
	}
	if err := s.lend(lib); err != nil {
		s.shutdown()
		return nil, err
	}
	return s, nil
}

// openMqueues opens the directory of the POSIX message queues (see
// ipc.OpenMqueues), or says why it cannot.
func openMqueues(cfg config) (*os.File, error) {
	t := time.Now()
	mq, via, err := ipc.OpenMqueues(cfg.self, cfg.uid, cfg.gid)
	if err != nil {
		// Not fatal here (tests run unprivileged), but no Reset will pass.
		cfg.log.Warn("cannot remove POSIX message queues on reset", "error", err)
	} else {
		cfg.log.Debug("message queues", "via", via, "took", time.Since(t))
	}
	return mq, err
}

// openFiles starts the file thread (if the runner is root) and opens the
// workspace for the file requests.
func openFiles(cfg config) (*asuser.FileThread, *files.Workspace, error) {
	var thread *asuser.FileThread
	if os.Geteuid() == 0 {
		var err error
		if thread, err = asuser.StartFileThread(cfg.uid, cfg.gid); err != nil {
			return nil, nil, err
		}
	}
	ws, err := files.Open(cfg.workspace, thread)
	if err != nil {
		if thread != nil {
			thread.Close()
		}
		return nil, nil, err
	}
	if !ws.HasOpenat2() {
		cfg.log.Warn("no openat2: file requests resolve paths with an os.Root, which does not confine them under gVisor")
	}
	return thread, ws, nil
}

// procConfig is the configuration of the process table; beside a preloaded
// parent its kill(-1) is made from thread (see proc.Config).
func procConfig(cfg config, thread *asuser.FileThread) proc.Config {
	pcfg := proc.Config{UID: cfg.uid, GID: cfg.gid, Dir: cfg.workspace, Path: cfg.path, ReapAll: cfg.reapAll}
	if thread != nil {
		pcfg.KillFromFileThread = func() error {
			return thread.Do(func() error {
				// EPERM: processes it may not signal (the parent), which
				// gVisor may report when they come last.
				if err := asuser.KillAll(); !errors.Is(err, syscall.EPERM) {
					return err
				}
				return nil
			})
		}
	}
	return pcfg
}

// lend sets up what the runner lends user code besides the modules in lib
// (see prepareLib): matplotlib's directory there, and the egress proxy.
func (s *server) lend(lib string) error {
	if lib != "" {
		s.mpl = &mplConfig{dir: mplConfigDir(lib), seed: s.cfg.mplSeed, uid: s.cfg.uid, gid: s.cfg.gid}
		if err := s.mpl.reset(); err != nil {
			return err
		}
	}
	if len(s.cfg.proxyAddrs) > 0 {
		p, err := egressproxy.New(s.cfg.log, s.cfg.proxyAddrs, s.out.Send, s.egressRefused)
		if err != nil {
			return err
		}
		s.proxy = p
		s.userEnv = append(s.userEnv, proxyEnv(p.Addr(), lib)...)
	}
	return nil
}

// serve reads requests until stdin ends or ctx is done.
func (s *server) serve(ctx context.Context, stdin io.Reader) error {
	defer s.shutdown()
	s.prestart()
	lang, forked := s.prestartedLang()
	ready := &runnerv1.Ready{Prestarted: lang, PrestartedForked: forked}
	if s.cfg.versions {
		missing := make(chan []string, 1)
		go func() { missing <- s.preloadMissing(ctx) }()
		ready.Versions = s.versions(ctx)
		ready.PreloadMissing = <-missing
	}
	if err := s.out.Send(&runnerv1.Event{Kind: &runnerv1.Event_Ready{Ready: ready}}); err != nil {
		return err
	}
	s.cfg.log.Debug("ready", "versions", ready.GetVersions(), "preload_missing", ready.GetPreloadMissing())

	reqs := make(chan *runnerv1.Request)
	readErr := make(chan error, 1)
	go func() {
		r := bufio.NewReaderSize(stdin, 64<<10)
		for {
			req := new(runnerv1.Request)
			if err := wire.ReadFrame(r, req); err != nil {
				readErr <- err
				return
			}
			select {
			case reqs <- req:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			s.cancelActive()
			return nil
		case err := <-readErr:
			s.cancelActive()
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read request: %w", err)
		case req := <-reqs:
			s.dispatch(ctx, &wg, req)
		}
	}
}

func (s *server) dispatch(ctx context.Context, wg *sync.WaitGroup, req *runnerv1.Request) {
	if s.proxy != nil && s.proxy.Handle(req) {
		return
	}
	id := req.GetId()
	if c := req.GetCancel(); c != nil {
		s.mu.Lock()
		if s.active == c.GetRunId() && s.cancel != nil {
			s.cancel()
		}
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	if s.active != 0 {
		busy := s.active
		s.mu.Unlock()
		s.sendError(id, &wire.RunnerError{Code: runnerv1.Error_CODE_BUSY, Message: fmt.Sprintf("request %d is still being served", busy)})
		return
	}
	runCtx, cancel := context.WithCancel(ctx)
	s.active, s.cancel = id, cancel
	s.mu.Unlock()
	wg.Go(func() {
		ev := s.handle(runCtx, req)
		cancel()
		s.mu.Lock()
		s.active, s.cancel = 0, nil
		s.mu.Unlock()
		ev.Id = id
		if err := s.out.Send(ev); err != nil {
			s.cfg.log.Error("send answer", "request_id", id, "error", err)
		}
	})
}

func (s *server) cancelActive() {
	s.mu.Lock()
	if s.cancel != nil {
		s.cancel()
	}
	s.mu.Unlock()
}

// handle serves one request and returns its last event (without its id).
func (s *server) handle(ctx context.Context, req *runnerv1.Request) *runnerv1.Event {
	if req.GetRun() == nil {
		// Only a stateless run may take the prestarted interpreter, and
		// user code must never run beside one it did not take.
		s.dropPrestarted()
	}
	var err error
	switch k := req.GetKind().(type) {
	case *runnerv1.Request_Run:
		if s.proxy != nil {
			s.proxy.Begin(req.GetId())
			defer s.proxy.End(req.GetId())
		}
		var exit *runnerv1.Exit
		if exit, err = s.run(ctx, req.GetId(), k.Run); err == nil {
			return &runnerv1.Event{Kind: &runnerv1.Event_Exit{Exit: exit}}
		}
	case *runnerv1.Request_Reset_:
		if err = s.reset(ctx); err == nil {
			lang, forked := s.prestartedLang()
			return &runnerv1.Event{Kind: &runnerv1.Event_Done{Done: &runnerv1.Done{Prestarted: lang, PrestartedForked: forked}}}
		}
	case *runnerv1.Request_WriteFile:
		if err = s.files.Write(k.WriteFile.GetFile()); err == nil {
			return &runnerv1.Event{Kind: &runnerv1.Event_Done{Done: &runnerv1.Done{}}}
		}
	case *runnerv1.Request_ReadFile:
		var f *runnerv1.File
		if f, err = s.files.Read(k.ReadFile.GetPath(), k.ReadFile.GetMaxBytes()); err == nil {
			return &runnerv1.Event{Kind: &runnerv1.Event_File{File: f}}
		}
	case *runnerv1.Request_ListFiles:
		var l *runnerv1.FileList
		if l, err = s.files.List(k.ListFiles.GetPath()); err == nil {
			return &runnerv1.Event{Kind: &runnerv1.Event_FileList{FileList: l}}
		}
	default:
		err = &wire.RunnerError{Code: runnerv1.Error_CODE_INVALID_ARGUMENT, Message: fmt.Sprintf("unknown request kind %T", k)}
	}
	return errorEvent(err)
}

func (s *server) sendError(id uint64, err error) {
	ev := errorEvent(err)
	ev.Id = id
	if err := s.out.Send(ev); err != nil {
		s.cfg.log.Error("send error", "request_id", id, "error", err)
	}
}

// egressRefused tells run's program, on its stderr, about a connection the
// egress refused, since not every client shows the proxy's answer.
func (s *server) egressRefused(run uint64, line string) {
	ev := &runnerv1.Event{Id: run, Kind: &runnerv1.Event_Stderr{Stderr: []byte(line + "\n")}}
	if err := s.out.Send(ev); err != nil {
		s.cfg.log.Warn("send egress refusal", "error", err)
	}
}

// shutdown kills every user process; the sandbox is going away.
func (s *server) shutdown() {
	if s.proxy != nil {
		s.proxy.Close()
	}
	s.dropPrestarted()
	s.prestartMu.Lock()
	s.dropParent()
	s.prestartMu.Unlock()
	if err := s.procs.KillUser(nil); err != nil {
		s.cfg.log.Warn("kill user processes at shutdown", "error", err)
	}
	s.files.Close()
	if s.fileThread != nil {
		s.fileThread.Close()
	}
	s.memory.close()
	if s.mqueues != nil {
		s.mqueues.Close()
	}
}

// errorEvent reports err with an Error event: of the code of a
// [wire.RunnerError] in err's chain, the runner's failures that tell the agent
// what went wrong, else of CODE_UNSPECIFIED.
func errorEvent(err error) *runnerv1.Event {
	e := &runnerv1.Error{Message: err.Error()}
	var re *wire.RunnerError
	if errors.As(err, &re) {
		e.Code = re.Code
	}
	return &runnerv1.Event{Kind: &runnerv1.Event_Error{Error: e}}
}

func durationOr(d *durationpb.Duration, def, max time.Duration) time.Duration {
	if d == nil || d.AsDuration() <= 0 {
		return def
	}
	return min(d.AsDuration(), max)
}
