package runner

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/codemode-go/codemode/agent/internal/runner/proc"
	"github.com/codemode-go/codemode/agent/internal/runner/stdio"
)

// A prestarted interpreter is started, as the user, at the end of a Reset
// (and before the runner says it is ready), so that the next stateless run
// of its language finds the interpreter already initialised and only hands
// it the code: under gVisor starting Python costs tens of milliseconds and
// starting node hundreds, most of a short run.
//
// It is a fresh process started in a clean sandbox, it serves exactly one
// run, and it holds nothing but the interpreter's own start-up state, so it
// carries nothing from one run to the next. Any request other than a
// stateless run of its language discards it before that request touches the
// sandbox, and a Reset kills it with every other process of the user, so
// that no user code ever runs beside it.
//
// The language to prestart follows the sandbox's last stateless run (Python
// until the first one); a run of a language without a prestart form turns it
// off until a run of one that has it.
type prestarted struct {
	lang string
	from parentKind // the preloaded parent it was forked from, if any (see package preload)
	proc *proc.Proc
	std  *stdio.Pipes // standard input is a pipe
	code *os.File     // the write end of the interpreter's fd 3
}

// give hands the interpreter the run's code and standard input. The caller
// then starts std as for any run.
func (p *prestarted) give(code string, stdin []byte) {
	head := byte('0')
	if len(stdin) > 0 {
		head = '1'
	}
	p.std.SetStdin(stdin)
	b := make([]byte, 0, 1+len(code))
	b = append(b, head)
	stdio.Feed(p.code, append(b, code...))
}

// discard kills the interpreter and waits until it is gone.
func (p *prestarted) discard(log *slog.Logger) {
	proc.KillGroup(p.proc.Pid)
	p.std.CloseParent()
	p.code.Close()
	select {
	case <-p.proc.Done():
	case <-time.After(5 * time.Second):
		// The Reset that follows finds it, or fails.
		log.Warn("prestarted interpreter did not end after SIGKILL", "pid", p.proc.Pid)
	}
}

// prestartReadyTimeout bounds the wait for a prestarted interpreter to be
// ready: well within the agent's bound on a whole Reset
// (pool.DefaultResetTimeout), so that a slow start costs the next run its
// head start, not the sandbox.
const prestartReadyTimeout = 3 * time.Second

// prestart starts an interpreter for the next stateless run, unless one is
// already there or none is wanted, and waits until it is ready. A failure
// only leaves the next run to start its own interpreter.
func (s *server) prestart() {
	s.prestartMu.Lock()
	defer s.prestartMu.Unlock()
	if s.pre != nil || s.prestartLang == "" {
		return
	}
	lang, ok := languageFor(s.prestartLang)
	if !ok || lang.Prestart == nil {
		return
	}
	// The parent is started (or replaced) here, in a sandbox just
	// verified clean, whichever kind the next run is likely to want.
	from := noParent
	if s.preloadedParent(lang) != nil {
		from = s.prestartFrom
	}
	s.prestartOne(lang, from)
}

// prestartOne starts an interpreter of lang, forked from a preloaded
// parent (see forkable) or fresh, and waits until it is ready. Called with
// prestartMu held.
func (s *server) prestartOne(lang language, from parentKind) {
	std, err := stdio.NewPipes(nil, true)
	if err != nil {
		s.cfg.log.Warn("prestart interpreter", "lang", lang.Name, "error", err)
		return
	}
	var codeR, codeW, readyR, readyW *os.File
	codeR, codeW, err = os.Pipe()
	if err == nil {
		readyR, readyW, err = os.Pipe()
	}
	if err == nil {
		var p *proc.Proc
		p, from, err = s.startPrestarted(lang, from, append(std.Child(), codeR, readyW))
		if err == nil {
			s.pre = &prestarted{lang: lang.Name, from: from, proc: p, std: std, code: codeW}
		}
	}
	std.CloseChild()
	stdio.CloseAll(codeR, readyW)
	if s.pre == nil {
		std.CloseParent()
		stdio.CloseAll(codeW, readyR)
		s.prestartFailed(lang.Name, fmt.Errorf("start: %w", err))
		return
	}
	defer readyR.Close()
	if err := readyR.SetReadDeadline(time.Now().Add(prestartReadyTimeout)); err != nil {
		s.cfg.log.Warn("prestart interpreter: set deadline", "error", err)
	}
	if _, err := readyR.Read(make([]byte, 1)); err != nil {
		forked := s.pre.from != noParent
		s.pre.discard(s.cfg.log)
		s.pre = nil
		if forked {
			// A parent whose child did not get ready is not trusted
			// with the next one; after maxPrestartFailures such in a
			// row the sandbox has none, and runs take fresh
			// interpreters, as this one does now.
			s.forkFailures++
			s.cfg.log.Warn("interpreter forked from preloaded parent not ready; parent dropped", "lang", lang.Name, "failures", s.forkFailures, "error", err)
			s.dropParent()
			s.prestartOne(lang, noParent)
			return
		}
		s.prestartFailed(lang.Name, fmt.Errorf("not ready: %w", err))
		return
	}
	s.prestartFailures = 0
	if from != noParent {
		s.forkFailures = 0
	}
}

// maxPrestartFailures is how many prestarts in a row may fail before the
// runner stops trying (an image without the interpreter, say): each failure
// is logged, and runs start their own interpreters as without prestarting.
const maxPrestartFailures = 3

func (s *server) prestartFailed(lang string, err error) {
	s.prestartFailures++
	if s.prestartFailures < maxPrestartFailures {
		s.cfg.log.Warn("prestart interpreter", "lang", lang, "error", err)
		return
	}
	s.cfg.log.Warn("prestart interpreter failed repeatedly; prestarting stops", "lang", lang, "failures", s.prestartFailures, "error", err)
	s.prestartLang = ""
}

// takePrestarted returns the prestarted interpreter if a run of lang can
// use it (only a stateless one can), and discards it otherwise. A stateless
// run also decides what the next prestart is.
//
// With a preloaded parent, a stateless run whose code names a preloaded
// module gets an interpreter forked from the parent that holds what it
// imports (wantedParent): the one prestarted if it holds that much, else one
// forked now in its place. Other code takes the one prestarted, whichever
// it is: a forked interpreter costs a fresh one's start when it is forked,
// but its run and its exit cost more than a fresh one's (its address space
// is its parent's). The next prestart is of the kind this run wanted.
func (s *server) takePrestarted(lang language, stateless bool, code string) *prestarted {
	s.prestartMu.Lock()
	defer s.prestartMu.Unlock()
	want := noParent
	if stateless && s.cfg.prestart && s.prestartFailures < maxPrestartFailures {
		s.prestartLang = ""
		if lang.Prestart != nil {
			s.prestartLang = lang.Name
		}
		want = s.wantedParent(lang, code)
		s.prestartFrom = want
		s.parentWanted = s.parentWanted || want != noParent
	}
	pre := s.pre
	s.pre = nil
	// A forked interpreter dies with its parent: one whose parent was
	// killed may still look alive until it is reaped.
	if pre != nil && stateless && pre.lang == lang.Name && pre.proc.Alive() && !(pre.from != noParent && (proc.Exited(pre.proc.Pid) || !s.parentLives(pre.from))) {
		if pre.from >= want || s.forkable(lang, want) <= pre.from {
			return pre
		}
	}
	if pre != nil {
		pre.discard(s.cfg.log)
	}
	if from := s.forkable(lang, want); from != noParent {
		// Forked now: tens of milliseconds, against the imports'
		// hundreds. A parent is not started here (only in a clean
		// sandbox), only used.
		s.prestartOne(lang, from)
		pre, s.pre = s.pre, nil
		return pre
	}
	return nil
}

// prestartedLang is the language of the prestarted interpreter, "" if
// there is none.
func (s *server) prestartedLang() (lang string, forked bool) {
	s.prestartMu.Lock()
	defer s.prestartMu.Unlock()
	if s.pre == nil {
		return "", false
	}
	return s.pre.lang, s.pre.from != noParent
}

// dropPrestarted discards the prestarted interpreter, if there is one.
func (s *server) dropPrestarted() {
	s.prestartMu.Lock()
	defer s.prestartMu.Unlock()
	if s.pre != nil {
		s.pre.discard(s.cfg.log)
		s.pre = nil
	}
}

// startPrestarted starts a prestarted interpreter with files as its fds
// 0-4: forked from what forkable(from) says lives (see package preload),
// else a fresh interpreter. It says which it started.
func (s *server) startPrestarted(lang language, from parentKind, files []*os.File) (*proc.Proc, parentKind, error) {
	if from = s.forkable(lang, from); from != noParent {
		z := s.parent
		if from == lightParent {
			z = z.Light()
		}
		fs, done, err := s.procs.UserFiles(files)
		if err == nil {
			var p *proc.Proc
			p, err = z.ForkInterpreter(fs)
			done()
			if err == nil {
				return p, from, nil
			}
		}
		// A parent that failed to fork is not trusted with the next
		// one, nor its light parent, made only with it.
		s.cfg.log.Warn("fork from preloaded parent", "lang", lang.Name, "light", from == lightParent, "error", err)
		s.dropParent()
	}
	p, err := s.procs.Start(proc.Spec{Argv: lang.Prestart, Env: s.env(lang), Files: files})
	return p, noParent, err
}
