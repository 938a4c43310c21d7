package runner

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/agent/internal/languages"
	"github.com/codemode-go/codemode/agent/internal/runner/artifacts"
	"github.com/codemode-go/codemode/agent/internal/runner/proc"
	"github.com/codemode-go/codemode/agent/internal/runner/stdio"
	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	runlimits "github.com/codemode-go/codemode/internal/limits"
)

// maxArg is the longest single argument the kernel (Linux and gVisor alike)
// lets execve pass: MAX_ARG_STRLEN, 32 pages, including the NUL. Longer code
// is handed to the interpreter on fd 3 instead of as an argument.
const maxArg = 128<<10 - 1

// language says how to run code of one language: its entry in the one
// table (languages.All).
type language struct {
	languages.Language
}

// languageFor returns the language called name (or with name as an alias),
// as in codemode.execution.v1.Execution.language.
func languageFor(name string) (language, bool) {
	l, ok := languages.Lookup(name)
	return language{l}, ok
}

// argv runs code passed as an argument.
func (l language) argv(code string) []string {
	return append(append([]string{l.Interpreter}, l.CodeArgs...), code)
}

// fdArgv runs code read from fd 3.
func (l language) fdArgv() []string { return append([]string{l.Interpreter}, l.FDArgs...) }

// env is the environment of user code: nothing of the runner's own.
func (s *server) env(lang language) []string {
	env := []string{
		"HOME=" + s.cfg.workspace,
		"PATH=" + s.cfg.path,
		"LANG=C.UTF-8",
		"PWD=" + s.cfg.workspace,
	}
	env = append(env, s.userEnv...)
	return append(env, lang.Env...)
}

// run serves a Run request.
func (s *server) run(ctx context.Context, id uint64, r *runnerv1.Run) (*runnerv1.Exit, error) {
	lang, ok := languageFor(r.GetLanguage())
	if !ok {
		return nil, &wire.RunnerError{Code: runnerv1.Error_CODE_INVALID_ARGUMENT, Message: runlimits.UnknownLanguage(r.GetLanguage(), languages.Names()).Error()}
	}
	if lang.Requires != "" {
		// A compiled language's compiler: missing, it is the image's
		// fault, not a result of the user's code.
		if _, err := s.procs.LookPath(lang.Requires); err != nil {
			return nil, err
		}
	}
	// Taken (or discarded) before anything of the run touches the sandbox.
	pre := s.takePrestarted(lang, !r.GetStateful(), r.GetCode())
	for _, f := range r.GetFiles() {
		if err := s.files.Write(f); err != nil {
			if pre != nil {
				pre.discard(s.cfg.log)
			}
			return nil, err
		}
	}
	lim := limits{
		timeout: durationOr(r.GetTimeout(), DefaultTimeout, MaxTimeout),
		output:  r.GetOutputLimit(),
		memory:  r.GetMemoryLimit(),
	}
	if lim.output == 0 {
		lim.output = DefaultOutputLimit
	}
	before := s.prepareOutputs()
	o := stdio.NewOutput(id, s.out, lim.output)
	var exit *runnerv1.Exit
	var err error
	switch {
	case r.GetStateful() && lang.Kernel != nil:
		exit, err = s.runKernel(ctx, o, lang, r, lim)
	case r.GetStateful() && lang.Shell:
		exit, err = s.runShell(ctx, o, lang, r, lim)
	default:
		// A stateful run of another language keeps only its files (and
		// background processes) between runs.
		exit, err = s.runOnce(ctx, o, lang, pre, r.GetCode(), r.GetStdin(), lim, !r.GetStateful())
	}
	if err != nil {
		return nil, err
	}
	s.outputs().Collect(exit, before)
	return exit, nil
}

// prepareOutputs creates the outputs directory if it is missing (as the
// user's) and returns what it holds now (see artifacts.Dir.Snapshot). A
// directory that cannot be made gives an empty snapshot.
func (s *server) prepareOutputs() artifacts.Snapshot {
	if err := s.files.MakeDir(wire.OutputsDir); err != nil {
		s.cfg.log.Debug("create outputs directory", "error", err)
	}
	return s.outputs().Snapshot()
}

// outputs is the outputs directory, where runs leave their artifacts.
func (s *server) outputs() artifacts.Dir {
	return artifacts.Dir{Workspace: s.cfg.workspace, UID: s.cfg.uid, GID: s.cfg.gid, Log: s.cfg.log}
}

type limits struct {
	timeout time.Duration
	output  uint64
	memory  uint64 // 0: the sandbox's limit only
	// interrupt, when set, is tried before a run that timed out or was
	// cancelled is killed: it reports whether the run ended by itself
	// once asked to (done closed), so that nothing need be killed.
	interrupt func(done <-chan struct{}) bool
}

// runOnce runs code in a fresh interpreter process: pre if not nil, else
// one it starts. With sweep, the
// processes the run leaves behind are killed when it ends: a run that is not
// part of a session has nobody to hand them to, and leftovers (the remains
// of a fork bomb) would only weigh on the next run.
func (s *server) runOnce(ctx context.Context, o *stdio.Output, lang language, pre *prestarted, code string, stdin []byte, lim limits, sweep bool) (*runnerv1.Exit, error) {
	start, cpu0 := time.Now(), selfCPU()
	how, from := "cold", noParent
	var p *proc.Proc
	var std *stdio.Pipes
	if pre != nil {
		how, from = "prestarted", pre.from
		p, std = pre.proc, pre.std
		pre.give(code, stdin)
	} else {
		var err error
		if p, std, err = s.startCold(lang, code, stdin); err != nil {
			return nil, err
		}
	}
	forked := time.Now()
	std.Start(o)
	// A forked interpreter reports its exit code as it exits, and the run
	// ends on that (see preload.Parent's end reports); its sweep kills it
	// with the rest, and the Reset waits for it.
	ended := p.Done()
	if p.Ending() != nil && sweep {
		ended = firstClosed(p.Done(), p.Ending())
	}
	st := s.supervise(ctx, ended, p.Pid, p.Done(), lim, s.keepPgid())
	exited := time.Now()
	status, ending := runStatus(p)
	exit := &runnerv1.Exit{
		Code:      proc.ExitCode(status),
		TimedOut:  st.timedOut,
		OomKilled: st.oom || st.diedOfMemory(status),
	}
	if sweep && st.err == nil {
		var keep []int
		if k := s.keepPgid(); k != 0 {
			keep = []int{k}
		}
		st.err = s.procs.KillUserEnding(keep, ending)
	}
	swept := time.Now()
	if ending != 0 && s.cfg.log.Enabled(ctx, slog.LevelDebug) {
		// What the run did not wait for.
		go func() {
			<-p.Done()
			s.cfg.log.Debug("reported interpreter reaped", "pid", ending, "after", time.Since(exited))
		}()
	}
	exit.Truncated = o.Finish(s.cfg.drainGrace)
	exit.Duration = durationpb.New(time.Since(start))
	s.cfg.log.Debug("run", "lang", lang.Name, "interpreter", how, "forked_from", from, "reported", ending != 0, "start", forked.Sub(start), "wait", exited.Sub(forked), "sweep", swept.Sub(exited), "drain", time.Since(swept), "runner_cpu", selfCPU()-cpu0)
	return exit, st.err
}

// runStatus is the wait status of a run's interpreter p once the run has
// ended: p's own if it has been reaped, else the exit code p reported, with
// p's pid as the process still ending.
func runStatus(p *proc.Proc) (status syscall.WaitStatus, ending int) {
	select {
	case <-p.Done():
		return p.Status(), 0
	default:
	}
	select {
	case <-p.Ending():
		return syscall.WaitStatus(p.Reported() << 8), p.Pid
	default:
		return p.Status(), 0
	}
}

// firstClosed returns a channel closed when a or b is.
func firstClosed(a, b <-chan struct{}) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		select {
		case <-a:
		case <-b:
		}
		close(c)
	}()
	return c
}

// startCold starts a fresh interpreter for code: as an argument, or on fd 3
// when it is too long for one.
func (s *server) startCold(lang language, code string, stdin []byte) (*proc.Proc, *stdio.Pipes, error) {
	argv := lang.argv(code)
	var extra []*os.File
	var codeW *os.File
	if len(code) > maxArg || lang.CodeArgs == nil {
		argv = lang.fdArgv()
		codeR, w, err := os.Pipe()
		if err != nil {
			return nil, nil, fmt.Errorf("create pipe: %w", err)
		}
		extra, codeW = []*os.File{codeR}, w
	}
	std, err := stdio.NewPipes(stdin, false)
	if err != nil {
		stdio.CloseAll(extra...)
		stdio.CloseAll(codeW)
		return nil, nil, err
	}
	p, err := s.procs.Start(proc.Spec{Argv: argv, Env: s.env(lang), Files: append(std.Child(), extra...)})
	std.CloseChild()
	stdio.CloseAll(extra...)
	if err != nil {
		std.CloseParent()
		stdio.CloseAll(codeW)
		return nil, nil, err
	}
	if codeW != nil {
		stdio.Feed(codeW, []byte(code))
	}
	return p, std, nil
}

// stopped says why supervise stopped a run, if it did.
type stopped struct {
	timedOut, cancelled, oom bool
	// interrupted: the run timed out or was cancelled, and ended when
	// interrupted, so nothing was killed.
	interrupted bool
	err         error // the run's processes could not be killed
	// The most memory the sandbox used during the run as the watchdog saw
	// it, and the sandbox's limit (0: unknown); see diedOfMemory.
	memPeak, memLimit uint64
}

// supervise waits until done is closed. When the timeout passes first, or
// ctx is done (Cancel), or the sandbox runs out of memory, it kills process
// group pgid and every other process of the user except process group
// keepPgid (a stateful interpreter that is not part of this run), and waits
// until exited is closed.
func (s *server) supervise(ctx context.Context, done <-chan struct{}, pgid int, exited <-chan struct{}, lim limits, keepPgid int) (st stopped) {
	timer := time.NewTimer(lim.timeout)
	defer timer.Stop()
	watch := s.watchMemory(done, lim.memory)
	defer func() { st.memPeak, st.memLimit = watch.peak.Load(), watch.limit }()
	select {
	case <-done:
		// Under load the sandbox kernel may kill a process that fails to
		// get memory just as the watchdog fires: both are then ready, and
		// select picks either. The run still ended for memory.
		select {
		case <-watch.fired:
			st.oom = true
		default:
		}
		return st
	case <-timer.C:
		st.timedOut = true
	case <-ctx.Done():
		st.cancelled = true
	case <-watch.fired:
		st.oom = true
	}
	if !st.oom && lim.interrupt != nil && lim.interrupt(done) {
		st.interrupted = true
		return st
	}
	proc.KillGroup(pgid)
	var keep []int
	if keepPgid != 0 {
		keep = []int{keepPgid}
	}
	if err := s.procs.KillUser(keep); err != nil {
		st.err = err
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		st.err = fmt.Errorf("process %d did not end after SIGKILL", pgid)
	}
	return st
}

// keepPgid is the process group that killing a run must spare: the Python
// kernel's, which holds the state of a session.
func (s *server) keepPgid() int {
	if s.kernel != nil && s.kernel.alive() {
		return s.kernel.proc.Pid
	}
	return 0
}

// selfCPU is the CPU time the runner itself has used so far (user and
// system), for the debug log.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
