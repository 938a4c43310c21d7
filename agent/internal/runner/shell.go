package runner

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/agent/internal/runner/proc"
	"github.com/codemode-go/codemode/agent/internal/runner/stdio"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// shellState is what a shell session keeps between runs: the working
// directory and the shell's variables (and, for bash, its functions), in the
// form the shell itself printed them (so that it can read them back).
type shellState struct {
	cwd     string
	exports string
}

// maxShellState bounds what a shell may report as its state.
const maxShellState = 1 << 20

// Each run of a shell session is a fresh shell that first restores the state
// of the previous run and, when it exits, writes its new state to fd 3: the
// working directory, a NUL, the definitions to restore, a NUL. A run that
// ends without running the EXIT trap (killed, or the user replaced the trap)
// leaves the state as it was.
//
// bash keeps every variable (with its attributes: arrays, integers,
// read-only...) except those bash itself maintains, such as RANDOM, SECONDS,
// UID or BASH_* (IFS and OPTIND start afresh), and every function; sh (dash,
// which cannot list its functions or tell its own variables apart) keeps the
// exported variables. Restoring is silent: the run's stderr is the user's.
const (
	bashSave = `__codemode_save() {
	local IFS=$' \t\n' __codemode_n
	local -a __codemode_v=() __codemode_fn=()
	for __codemode_n in $(compgen -v); do
		case $__codemode_n in
		BASH|BASH_*|BASHOPTS|BASHPID|SHELLOPTS|PWD|OLDPWD|SHLVL|_|PPID|UID|EUID|GROUPS|HOSTNAME|HOSTTYPE|MACHTYPE|OSTYPE|RANDOM|SRANDOM|SECONDS|LINENO|EPOCHREALTIME|EPOCHSECONDS|HISTCMD|FUNCNAME|PIPESTATUS|DIRSTACK|COMP_*|OPTERR|OPTIND|IFS|__codemode_*) continue ;;
		esac
		__codemode_v+=("$__codemode_n")
	done
	for __codemode_n in $(compgen -A function); do
		case $__codemode_n in __codemode_*) ;; *) __codemode_fn+=("$__codemode_n") ;; esac
	done
	{
		pwd
		printf '\0'
		(( ${#__codemode_v[@]} )) && declare -p "${__codemode_v[@]}"
		(( ${#__codemode_fn[@]} )) && declare -f "${__codemode_fn[@]}"
		printf '\0'
	} >&3 2>/dev/null
}
trap __codemode_save EXIT
`
	shSave = `__codemode_save() {
	{ pwd; printf '\0'; export -p; printf '\0'; } >&3 2>/dev/null
}
trap __codemode_save EXIT
`
)

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func (s *server) shellPrelude(lang language, st *shellState) string {
	var b strings.Builder
	b.WriteString("{ :\n")
	b.WriteString(st.exports)
	b.WriteString("\n} 2>/dev/null\ncd -- ")
	b.WriteString(shellQuote(st.cwd))
	b.WriteString(" 2>/dev/null || cd -- ")
	b.WriteString(shellQuote(s.cfg.workspace))
	b.WriteString("\n")
	if lang.Interpreter == "bash" {
		b.WriteString(bashSave)
	} else {
		b.WriteString(shSave)
	}
	return b.String()
}

// runShell runs code in a fresh shell that continues the language's shell
// session.
func (s *server) runShell(ctx context.Context, o *stdio.Output, lang language, r *runnerv1.Run, lim limits) (*runnerv1.Exit, error) {
	st := s.shells[lang.Name]
	if st == nil {
		st = &shellState{cwd: s.cfg.workspace}
	}
	script := s.shellPrelude(lang, st) + r.GetCode() + "\n"

	stateR, stateW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create pipe: %w", err)
	}
	extra := []*os.File{stateW}
	argv := []string{lang.Interpreter, "-c", script}
	var scriptW *os.File
	if len(script) > maxArg {
		scriptR, w, err := os.Pipe()
		if err != nil {
			stdio.CloseAll(stateR, stateW)
			return nil, fmt.Errorf("create pipe: %w", err)
		}
		extra, scriptW = append(extra, scriptR), w
		argv = []string{lang.Interpreter, "/dev/fd/4"}
	}
	std, err := stdio.NewPipes(r.GetStdin(), false)
	if err != nil {
		stdio.CloseAll(stateR, scriptW)
		stdio.CloseAll(extra...)
		return nil, err
	}
	start := time.Now()
	p, err := s.procs.Start(proc.Spec{Argv: argv, Env: s.env(lang), Files: append(std.Child(), extra...)})
	std.CloseChild()
	stdio.CloseAll(extra...)
	if err != nil {
		std.CloseParent()
		stdio.CloseAll(stateR, scriptW)
		return nil, err
	}
	if scriptW != nil {
		stdio.Feed(scriptW, []byte(script))
	}
	state := readShellState(stateR)
	std.Start(o)
	sv := s.supervise(ctx, p.Done(), p.Pid, p.Done(), lim, s.keepPgid())
	exit := &runnerv1.Exit{Code: proc.ExitCode(p.Status()), TimedOut: sv.timedOut, OomKilled: sv.oom || sv.diedOfMemory(p.Status())}
	exit.Truncated = o.Finish(s.cfg.drainGrace)
	if next, ok := state.wait(s.cfg.drainGrace); ok {
		s.shells[lang.Name] = next
	} else {
		s.shells[lang.Name] = st
	}
	exit.Duration = durationpb.New(time.Since(start))
	return exit, sv.err
}

// stateReader collects what a shell writes on its state pipe.
type stateReader struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	complete chan struct{} // closed at the second NUL or at EOF
}

func readShellState(r *os.File) *stateReader {
	sr := &stateReader{complete: make(chan struct{})}
	go func() {
		defer r.Close()
		closed := false
		b := make([]byte, 4096)
		for {
			n, err := r.Read(b)
			sr.mu.Lock()
			if sr.buf.Len()+n <= maxShellState {
				sr.buf.Write(b[:n])
			}
			if !closed && bytes.Count(sr.buf.Bytes(), []byte{0}) >= 2 {
				close(sr.complete)
				closed = true
			}
			sr.mu.Unlock()
			if err != nil {
				if !closed {
					close(sr.complete)
				}
				return
			}
		}
	}()
	return sr
}

// wait returns the state once the shell has written all of it, waiting at
// most grace; ok is false if the state is missing or incomplete.
func (sr *stateReader) wait(grace time.Duration) (*shellState, bool) {
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-sr.complete:
	case <-t.C:
	}
	sr.mu.Lock()
	defer sr.mu.Unlock()
	parts := bytes.SplitN(sr.buf.Bytes(), []byte{0}, 3)
	if len(parts) < 3 {
		return nil, false
	}
	cwd := strings.TrimSuffix(string(parts[0]), "\n")
	if cwd == "" {
		return nil, false
	}
	return &shellState{cwd: cwd, exports: string(parts[1])}, true
}
