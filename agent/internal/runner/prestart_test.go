package runner

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/agent/internal/runner/proc"
	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/testenv"
)

// prestartedPID waits for the prestarted interpreter to be there and returns
// its pid.
func (h *harness) prestartedPID() int {
	h.t.Helper()
	var pid int
	testkit.WaitFor(h.t, 10*time.Second, "an interpreter to be prestarted", func() bool {
		h.s.prestartMu.Lock()
		defer h.s.prestartMu.Unlock()
		if h.s.pre == nil {
			return false
		}
		pid = h.s.pre.proc.Pid
		return true
	})
	return pid
}

// noPrestarted checks, after a request has been answered, that no
// interpreter is prestarted now and none comes.
func (h *harness) noPrestarted() {
	h.t.Helper()
	time.Sleep(200 * time.Millisecond) // room for one to come, if it would
	h.s.prestartMu.Lock()
	defer h.s.prestartMu.Unlock()
	if h.s.pre != nil {
		h.t.Fatalf("an interpreter (pid %d) is prestarted", h.s.pre.proc.Pid)
	}
}

// userProcsBesidesPrestarted lists the user's processes other than the
// prestarted interpreter.
func (h *harness) userProcsBesidesPrestarted() []proc.UserProc {
	h.t.Helper()
	h.s.prestartMu.Lock()
	defer h.s.prestartMu.Unlock()
	keep := 0
	if h.s.pre != nil {
		keep = h.s.pre.proc.Pid
	}
	ps, err := h.s.procs.UserProcs(keep)
	if err != nil {
		h.t.Fatal(err)
	}
	return ps
}

func (h *harness) reset() {
	h.t.Helper()
	if err := h.c.Reset(h.t.Context()); err != nil {
		h.t.Fatal(err)
	}
}

func gone(pid int) bool {
	st, ok := proc.ReadStat(pid)
	return !ok || st.State == 'Z' || st.State == 'X'
}

// A run in a prestarted interpreter is indistinguishable from one in an
// interpreter started for it: same output, errors, exit code, arguments,
// namespace, standard input and file descriptors.
func TestPrestartedPythonIsLikeCold(t *testing.T) {
	testPrestartedLikeCold(t, "python", pythonLikeColdCases, nil)
}

// pythonLikeColdCases are programs whose output, errors and exit code must
// be the same whichever way their interpreter was started.
var pythonLikeColdCases = []prestartCase{
	{name: "print", code: "print('hi', 6*7)"},
	{name: "exit code", code: "import sys; sys.exit(3)"},
	{name: "exit message", code: "import sys; sys.exit('bye')"},
	{name: "exit none", code: "raise SystemExit"},
	{name: "exception", code: "def f():\n    return 1/0\n\nf()"},
	{name: "exception chained", code: "try:\n    {}['k']\nexcept KeyError as e:\n    raise ValueError('v') from e"},
	{name: "syntax error", code: "x = (1,\nprint(x"},
	{name: "indentation error", code: "if True:\nprint(1)"},
	{name: "keyboard interrupt", code: "raise KeyboardInterrupt"},
	{name: "excepthook", code: "import sys\nsys.excepthook = lambda t, v, tb: print('hook', t.__name__)\nraise OSError('x')"},
	{name: "atexit", code: "import atexit; atexit.register(print, 'at exit'); print('body')"},
	{name: "argv and path", code: "import sys; print(sys.argv, repr(sys.path[0]), __name__, __file__ if '__file__' in dir() else None)"},
	{name: "namespace", code: "print(sorted(globals()))"},
	{name: "main module", code: "import sys; print(sys.modules['__main__'].__dict__ is globals(), __spec__, __doc__)"},
	{name: "no stdin", code: "import os, stat, sys; print(stat.S_ISCHR(os.fstat(0).st_mode), repr(sys.stdin.read()))"},
	{name: "stdin", code: "import sys; print(sys.stdin.read().upper())", stdin: "abc\ndef\n"},
	{name: "descriptors", code: "import os; print(sorted(os.listdir('/proc/self/fd')))"},
	{name: "environment", code: "import os; print(sorted(os.environ.items()))"},
	{name: "unicode", code: "print('héllo ✓', '\\u00e9')"},
	{name: "coding cookie", code: "# -*- coding: latin-1 -*-\nprint('plain')"},
	{name: "stderr", code: "import sys; print('out'); print('err', file=sys.stderr); sys.stderr.flush()"},
	{name: "import from workspace", code: "import helper; print(helper.VALUE)", files: map[string]string{"helper.py": "VALUE = 42\n"}},
	{name: "big code", code: bigCode("python")},
	{name: "warnings", code: "import warnings; warnings.warn('careful')"},
	{name: "finaliser", code: "class D:\n    def __del__(self):\n        print('finalised')\nd = D()\nprint('body')"},
}

// A Node.js run in a prestarted interpreter differs from `node -e` only in
// the internal frames of a stack trace (the launcher's vm call); output, the
// error, its source line and the exit code are the same.
func TestPrestartedNodeIsLikeCold(t *testing.T) {
	testPrestartedLikeCold(t, "javascript", []prestartCase{
		{name: "print", code: "console.log('hi', 6*7)"},
		{name: "globals", code: "console.log(process.argv, typeof require, typeof module, typeof exports, __filename, __dirname, process.cwd() === process.env.HOME)"},
		{name: "throw", code: "function f() { null.x }\nf()"},
		{name: "syntax error", code: "x = ("},
		{name: "exit", code: "process.exit(3)"},
		{name: "exit code", code: "process.exitCode = 4; console.error('e')"},
		{name: "unhandled rejection", code: "Promise.reject(new Error('rej'))"},
		{name: "timers", code: "setTimeout(() => console.log('later'), 50); console.log('now')"},
		{name: "no stdin", code: "console.log(JSON.stringify(require('fs').readFileSync(0, 'utf8')))"},
		{name: "stdin", code: "process.stdin.on('data', d => process.stdout.write(d.toString().toUpperCase()))", stdin: "abc\n"},
		{name: "require from workspace", code: "console.log(require('./helper.js').value)", files: map[string]string{"helper.js": "module.exports = {value: 42}\n"}},
		{name: "unicode", code: "console.log('héllo ✓')"},
		{name: "big code", code: bigCode("javascript")},
	}, func(stderr string) string {
		var keep []string
		for _, l := range strings.Split(stderr, "\n") {
			if !strings.HasPrefix(l, "    at ") {
				keep = append(keep, l)
			}
		}
		return strings.Join(keep, "\n")
	})
}

type prestartCase struct {
	name, code, stdin string
	files             map[string]string
}

// testPrestartedLikeCold runs each case in a runner without prestarting and
// in a prestarted interpreter of another, and compares what they print and
// how they exit. stderr, if not nil, normalises standard error first.
func testPrestartedLikeCold(t *testing.T, lang string, cases []prestartCase, stderr func(string) string) {
	if !isRoot() {
		testenv.Missing(t, "Reset kills processes by uid: needs root to run user code under a uid of its own")
	}
	t.Parallel()
	cold := newHarness(t, func(c *config) { c.prestart = false })
	warm := newHarness(t)
	warm.mustRun(lang, bigCode(lang)) // the next prestart is in lang
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			run := func(h *harness) result {
				r := &runnerv1.Run{Language: lang, Code: tc.code, Stdin: []byte(tc.stdin), Timeout: durationpb.New(20 * time.Second)}
				for name, content := range tc.files {
					r.Files = append(r.Files, &runnerv1.File{Path: name, Content: []byte(content)})
				}
				res := h.run(t.Context(), r)
				if res.err != nil {
					t.Fatal(res.err)
				}
				return res
			}
			cold.reset()
			want := run(cold)
			warm.reset()
			pid := warm.prestartedPID()
			warm.s.prestartMu.Lock()
			preLang := warm.s.pre.lang
			warm.s.prestartMu.Unlock()
			if preLang != lang {
				t.Fatalf("prestarted %s, want %s", preLang, lang)
			}
			got := run(warm)
			// The two runners have workspaces of their own.
			for _, r := range []*result{&want, &got} {
				h := cold
				if r == &got {
					h = warm
				}
				r.stdout = strings.ReplaceAll(r.stdout, h.ws, "WORKSPACE")
				r.stdout = strings.ReplaceAll(r.stdout, h.s.proxy.Addr(), "PROXY")
				if stderr != nil {
					r.stderr = stderr(r.stderr)
				}
			}
			if !gone(pid) {
				t.Fatalf("the prestarted interpreter %d outlived the run", pid)
			}
			if got.stdout != want.stdout || got.stderr != want.stderr || got.exit.GetCode() != want.exit.GetCode() {
				t.Fatalf("prestarted: code %d, stdout %q, stderr %q\ncold:        code %d, stdout %q, stderr %q",
					got.exit.GetCode(), got.stdout, got.stderr, want.exit.GetCode(), want.stdout, want.stderr)
			}
		})
	}
}

// The run really is served by the prestarted interpreter, one interpreter
// serves one run only, and it follows the language of the sandbox's runs.
func TestPrestartedInterpreter(t *testing.T) {
	if !isRoot() {
		testenv.Missing(t, "Reset kills processes by uid: needs root to run user code under a uid of its own")
	}
	t.Parallel()
	h := newHarness(t)
	ctx := t.Context()
	pid := h.prestartedPID()
	if r := h.mustRun("python", "import os; print(os.getpid())"); strings.TrimSpace(r.stdout) != strconv.Itoa(pid) {
		t.Fatalf("the run's pid is %q, want the prestarted %d", r.stdout, pid)
	}
	// Without a Reset nothing is prestarted: the next run starts its own.
	if r := h.mustRun("python", "import os; print(os.getpid())"); strings.TrimSpace(r.stdout) == strconv.Itoa(pid) {
		t.Fatal("a prestarted interpreter served two runs")
	}
	h.reset()
	next := h.prestartedPID()
	if next == pid {
		t.Fatal("Reset kept the old interpreter")
	}

	// Another language discards it before its code runs, and turns
	// prestarting off until the next Python run.
	if r := h.mustRun("bash", fmt.Sprintf("kill -0 %d 2>/dev/null && echo alive || echo gone", next)); r.stdout != "gone\n" {
		t.Fatalf("the prestarted interpreter was still there during a bash run: %q", r.stdout)
	}
	h.reset()
	h.noPrestarted()
	h.mustRun("python", "pass")
	h.reset()
	next = h.prestartedPID()

	// So does a session's run, and a file request.
	if r := h.run(ctx, &runnerv1.Run{Language: "python", Code: "x = 1", Stateful: true}); r.err != nil || r.exit.GetCode() != 0 {
		t.Fatalf("stateful run: %v %v", r.exit, r.err)
	}
	if !gone(next) {
		t.Fatal("a session's run left the prestarted interpreter running")
	}
	h.reset()
	next = h.prestartedPID()
	if _, err := h.c.ListFiles(ctx, "."); err != nil {
		t.Fatal(err)
	}
	if !gone(next) {
		t.Fatal("a file request left the prestarted interpreter running")
	}
	h.noPrestarted()

	// A prestarted interpreter that died is not used.
	h.reset()
	h.prestartedPID()
	h.s.prestartMu.Lock()
	pre := h.s.pre
	h.s.prestartMu.Unlock()
	proc.KillGroup(pre.proc.Pid)
	<-pre.proc.Done() // as the runner sees it
	if r := h.mustRun("python", "print('after')"); r.stdout != "after\n" {
		t.Fatalf("run after the prestarted interpreter died: %q %q", r.stdout, r.stderr)
	}
}

// With prestarting off nothing is started ahead.
func TestPrestartOff(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *config) { c.prestart = false })
	h.noPrestarted()
	h.mustRun("python", "pass")
	if isRoot() {
		h.reset()
	}
	h.noPrestarted()
}

// Without the interpreter in the sandbox, prestarting fails a few times and
// then stops; runs go on as without it.
func TestPrestartStopsAfterFailures(t *testing.T) {
	if !isRoot() {
		testenv.Missing(t, "Reset kills processes by uid: needs root to run user code under a uid of its own")
	}
	t.Parallel()
	// Reachable by the user code's uid, which t.TempDir's parent is not.
	bin, err := os.MkdirTemp("", "runner-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bin) })
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"bash", "sh"} {
		target, err := exec.LookPath(name)
		if err != nil {
			t.Skip(err)
		}
		if err := os.Symlink(target, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	h := newHarness(t, func(c *config) { c.path = bin }) // no python3
	for i := 0; i < maxPrestartFailures; i++ {
		h.reset()
	}
	h.s.prestartMu.Lock()
	failures := h.s.prestartFailures
	off := failures >= maxPrestartFailures && h.s.prestartLang == ""
	h.s.prestartMu.Unlock()
	if !off || failures != maxPrestartFailures {
		t.Fatalf("after %d failed prestarts: off %v, failures %d", maxPrestartFailures, off, failures)
	}
	h.noPrestarted()
	if r := h.mustRun("bash", "echo still"); r.stdout != "still\n" {
		t.Fatalf("bash run: %q %q", r.stdout, r.stderr)
	}
	r := h.run(t.Context(), &runnerv1.Run{Language: "python", Code: "print(1)"})
	if !errors.Is(r.err, wire.ErrFailedPrecondition) {
		t.Fatalf("python run without python3: %v, want failed_precondition", r.err)
	}
	h.reset()
	h.noPrestarted()
}
