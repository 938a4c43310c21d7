package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/agent/internal/runner/proc"
	"github.com/codemode-go/codemode/agent/internal/runner/rawfile"
	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/testenv"
)

// The tests in this file run the runner inside the test process, on the
// host, with temporary directories for the workspace and scratch places and
// a uid of its own per test (so that killing "every process of the user"
// stays within the test). As root they exercise the real uid switch; the
// container tests run the real binary under gVisor.

func TestMain(m *testing.M) {
	code := m.Run()
	if runnerBin != "" {
		os.RemoveAll(filepath.Dir(runnerBin))
	}
	os.Exit(code)
}

// Each harness gets its own uid, far from real accounts.
var nextUID atomic.Int32

type harness struct {
	t        *testing.T
	s        *server
	c        *wire.Client
	ws       string
	tmp, shm string
	uid      int
	reqW     io.WriteCloser // the runner's stdin, for raw frames
	evR      io.Reader
}

func isRoot() bool { return os.Geteuid() == 0 }

// newHarness starts a runner; opts change its configuration.
func newHarness(t *testing.T, opts ...func(*config)) *harness {
	t.Helper()
	base, err := os.MkdirTemp("", "runner-test-")
	if err != nil {
		t.Fatal(err)
	}
	// The user must be able to reach the workspace.
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, ws: filepath.Join(base, "workspace"), tmp: filepath.Join(base, "tmp"), shm: filepath.Join(base, "shm")}
	for _, d := range []string{h.tmp, h.shm} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h.uid = 62000 + int(nextUID.Add(1))
	cfg := defaultConfig(slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})))
	cfg.workspace = h.ws
	cfg.scratch = []string{h.tmp, h.shm}
	cfg.uid, cfg.gid = h.uid, h.uid
	cfg.reapAll = false
	cfg.cgroupMemory = ""
	cfg.proxyAddrs = []string{"127.0.0.1:0"}
	for _, o := range opts {
		o(&cfg)
	}
	reqR, reqW := io.Pipe()
	evR, evW := io.Pipe()
	h.reqW, h.evR = reqW, evR
	s, err := newServer(cfg, evW)
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	served := make(chan error, 1)
	go func() { served <- s.serve(context.Background(), reqR) }()
	h.c = wire.NewClient(evR, reqW)
	t.Cleanup(func() {
		reqW.Close() // stdin ends: the runner kills the user's processes and returns
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
		evW.Close()
		h.c.Close()
		if ps, _ := s.procs.UserProcs(0); len(ps) > 0 {
			t.Errorf("user processes left after the runner ended: %v", ps)
		}
		os.RemoveAll(base)
	})
	if _, err := h.c.Ready(t.Context()); err != nil {
		t.Fatal(err)
	}
	return h
}

// testWriter sends the runner's log to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

type result struct {
	exit           *runnerv1.Exit
	stdout, stderr string
	err            error
}

func (h *harness) run(ctx context.Context, r *runnerv1.Run) result {
	h.t.Helper()
	var out, errb bytes.Buffer
	exit, err := h.c.Run(ctx, r, func(s wire.Stream, b []byte) {
		if s == wire.Stdout {
			out.Write(b)
		} else {
			errb.Write(b)
		}
	})
	return result{exit: exit, stdout: out.String(), stderr: errb.String(), err: err}
}

func (h *harness) mustRun(lang, code string) result {
	h.t.Helper()
	r := h.run(h.t.Context(), &runnerv1.Run{Language: lang, Code: code, Timeout: durationpb.New(20 * time.Second)})
	if r.err != nil {
		h.t.Fatalf("run %s %q: %v", lang, code, r.err)
	}
	return r
}

func bigCode(lang string) string {
	var line, last string
	switch lang {
	case "python":
		line, last = "x = 1\n", "print('big', x)\n"
	case "javascript":
		line, last = "var x = 1;\n", "console.log('big', x)\n"
	default:
		line, last = "x=1\n", "echo big $x\n"
	}
	return strings.Repeat(line, maxArg/len(line)+1) + last
}

func TestRun(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	uid := os.Geteuid()
	if isRoot() {
		uid = h.uid
	}
	cases := []struct {
		name, lang, code string
		stdin            string
		stdout, stderr   string // stderr: a substring
		code32           int32
	}{
		{name: "python print", lang: "python", code: "print('hi')", stdout: "hi\n"},
		{name: "python exit code", lang: "python", code: "import sys; sys.exit(3)", code32: 3},
		{name: "python exception", lang: "python", code: "1/0", stderr: "ZeroDivisionError", code32: 1},
		{name: "python stdin", lang: "python", code: "import sys; print(sys.stdin.read().upper())", stdin: "abc", stdout: "ABC\n"},
		{name: "python no stdin", lang: "python", code: "import sys; print(repr(sys.stdin.read()))", stdout: "''\n"},
		{name: "python identity", lang: "python", code: "import os; print(os.getuid(), os.geteuid(), os.getgroups(), os.getcwd() == os.environ['HOME'])",
			stdout: fmt.Sprintf("%d %d [] True\n", uid, uid)},
		{name: "python clean environment", lang: "python", code: "import os; print(sorted(os.environ))",
			stdout: "['HOME', 'HTTPS_PROXY', 'HTTP_PROXY', 'LANG', 'NO_PROXY', 'PATH', 'PWD', 'PYTHONUNBUFFERED', 'http_proxy', 'https_proxy', 'no_proxy']\n"},
		{name: "python no privileges", lang: "python",
			code:   "s = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() if ':\\t' in l); print(s['CapEff'], s['CapPrm'], s['NoNewPrivs'])",
			stdout: "0000000000000000 0000000000000000 1\n"},
		{name: "python own process group", lang: "python", code: "import os; print(os.getpgrp() == os.getpid())", stdout: "True\n"},
		{name: "python code not through a shell", lang: "python", code: "import sys; print(sys.argv)", stdout: "['-c']\n"},
		{name: "python big code", lang: "python", code: bigCode("python"), stdout: "big 1\n"},
		{name: "bash", lang: "bash", code: "echo $((6*7)); echo oops >&2; exit 4", stdout: "42\n", stderr: "oops", code32: 4},
		{name: "bash stdin", lang: "bash", code: "read -r a; echo \"<$a>\"", stdin: "line\n", stdout: "<line>\n"},
		{name: "bash killed by signal", lang: "bash", code: "kill -TERM $$", code32: 128 + 15},
		{name: "bash writes to /dev/stdout", lang: "bash", code: "echo out > /dev/stdout; echo err > /dev/stderr", stdout: "out\n", stderr: "err"},
		{name: "bash big code", lang: "bash", code: bigCode("bash"), stdout: "big 1\n"},
		{name: "sh", lang: "sh", code: "echo $0; printf '%s\\n' \"$HOME\" | grep -c workspace", stdout: "sh\n1\n"},
		{name: "sh big code", lang: "sh", code: bigCode("sh"), stdout: "big 1\n"},
		{name: "javascript", lang: "javascript", code: "console.log(1 + 1); console.error('e'); process.exitCode = 2", stdout: "2\n", stderr: "e", code32: 2},
		{name: "javascript big code", lang: "javascript", code: bigCode("javascript"), stdout: "big 1\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// One runner serves one request at a time: the subtests take
			// turns (the client serializes them).
			r := h.run(t.Context(), &runnerv1.Run{Language: tc.lang, Code: tc.code, Stdin: []byte(tc.stdin), Timeout: durationpb.New(20 * time.Second)})
			if r.err != nil {
				t.Fatal(r.err)
			}
			if r.stdout != tc.stdout || !strings.Contains(r.stderr, tc.stderr) || r.exit.GetCode() != tc.code32 {
				t.Fatalf("got code %d, stdout %q, stderr %q; want code %d, stdout %q, stderr containing %q",
					r.exit.GetCode(), r.stdout, r.stderr, tc.code32, tc.stdout, tc.stderr)
			}
			if r.exit.GetTimedOut() || r.exit.GetTruncated() || r.exit.GetDuration().AsDuration() <= 0 {
				t.Fatalf("exit = %v", r.exit)
			}
		})
	}
}

func TestRunUnknownLanguage(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.run(t.Context(), &runnerv1.Run{Language: "cobol", Code: "x"})
	if !errors.Is(r.err, wire.ErrInvalidArgument) {
		t.Fatalf("Run = %v, want ErrInvalidArgument", r.err)
	}
	// The runner still serves.
	if got := h.mustRun("bash", "echo ok").stdout; got != "ok\n" {
		t.Fatalf("after a refused run: %q", got)
	}
}

// Output is passed on as it is produced, not when the program ends.
func TestRunStreams(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	start := time.Now()
	var mu sync.Mutex
	var times []time.Duration
	_, err := h.c.Run(t.Context(), &runnerv1.Run{Language: "python", Code: "import time\nfor i in range(3):\n    print(i)\n    time.sleep(0.4)"},
		func(s wire.Stream, b []byte) {
			mu.Lock()
			defer mu.Unlock()
			for range bytes.Count(b, []byte("\n")) {
				times = append(times, time.Since(start))
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	if len(times) != 3 {
		t.Fatalf("got %d lines", len(times))
	}
	// The lines are printed 0.4 s apart. Buffered output brings them all
	// at once; on a loaded machine one line may come late, which shortens
	// its gap to the next, so the bounds are loose.
	for i := 1; i < 3; i++ {
		if gap := times[i] - times[i-1]; gap < 100*time.Millisecond {
			t.Fatalf("line %d came %v after line %d: output was buffered (times %v)", i, gap, i-1, times)
		}
	}
	if span := times[2] - times[0]; span < 400*time.Millisecond {
		t.Fatalf("the lines came within %v of each other: output was buffered (times %v)", span, times)
	}
}

func TestRunTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, lang, code string }{
		{"sleep", "bash", "sleep 3600"},
		{"busy loop", "python", "while True: pass"},
		{"sleep with escaped background", "bash", "setsid sleep 3600 & (sleep 3600 &) ; sleep 3600"},
		{"ignores SIGTERM", "python", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(3600)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			start := time.Now()
			r := h.run(t.Context(), &runnerv1.Run{Language: tc.lang, Code: tc.code, Timeout: durationpb.New(500 * time.Millisecond)})
			if r.err != nil {
				t.Fatal(r.err)
			}
			if !r.exit.GetTimedOut() || r.exit.GetCode() != 137 {
				t.Fatalf("exit = %v, want timed out with 137", r.exit)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Fatalf("took %v", d)
			}
			if isRoot() {
				if ps, _ := h.s.procs.UserProcs(0); len(ps) > 0 {
					t.Fatalf("processes left after the timeout: %v", ps)
				}
			}
			if got := h.mustRun("bash", "echo next").stdout; got != "next\n" {
				t.Fatalf("next run: %q", got)
			}
		})
	}
}

func TestRunOutputLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const limit = 1000
	r := h.run(t.Context(), &runnerv1.Run{Language: "python", OutputLimit: limit,
		Code: "import sys\nsys.stdout.write('x' * (20 << 20))\nsys.stderr.write('y' * 5000)\nprint('done', file=sys.stderr)\nsys.exit(5)"})
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := len(r.stdout) + len(r.stderr); got != limit {
		t.Fatalf("passed on %d bytes, want %d", got, limit)
	}
	// The program was not blocked by the cap: it ran to its end.
	if !r.exit.GetTruncated() || r.exit.GetCode() != 5 {
		t.Fatalf("exit = %v, want truncated with code 5", r.exit)
	}
}

func TestRunCancel(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx, cancel := context.WithCancel(t.Context())
	exit, err := h.c.Run(ctx, &runnerv1.Run{Language: "bash", Code: "echo started; sleep 3600"}, func(wire.Stream, []byte) { cancel() })
	if !errors.Is(err, context.Canceled) || exit.GetCode() != 137 || exit.GetTimedOut() {
		t.Fatalf("Run = %v, %v; want the Exit of a killed run and Canceled", exit, err)
	}
	if got := h.mustRun("bash", "echo next").stdout; got != "next\n" {
		t.Fatalf("next run: %q", got)
	}
}

// A request that arrives while another is served is refused with BUSY; a
// Cancel is not a request of its own.
func TestBusy(t *testing.T) {
	t.Parallel()
	base, err := os.MkdirTemp("", "runner-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	os.Chmod(base, 0o755)
	cfg := defaultConfig(slog.New(slog.NewTextHandler(io.Discard, nil)))
	cfg.workspace, cfg.scratch, cfg.reapAll, cfg.cgroupMemory = filepath.Join(base, "ws"), nil, false, ""
	cfg.proxyAddrs = []string{"127.0.0.1:0"}
	cfg.uid = 62000 + int(nextUID.Add(1))
	cfg.gid = cfg.uid
	reqR, reqW := io.Pipe()
	evR, evW := io.Pipe()
	s, err := newServer(cfg, evW)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.serve(t.Context(), reqR) }()
	send := func(req *runnerv1.Request) {
		if err := wire.WriteFrame(reqW, req); err != nil {
			t.Fatal(err)
		}
	}
	next := func() *runnerv1.Event {
		var ev runnerv1.Event
		if err := wire.ReadFrame(evR, &ev); err != nil {
			t.Fatal(err)
		}
		return &ev
	}
	if next().GetReady() == nil {
		t.Fatal("first event is not Ready")
	}
	send(&runnerv1.Request{Id: 1, Kind: &runnerv1.Request_Run{Run: &runnerv1.Run{Language: "bash", Code: "echo go; sleep 3600"}}})
	if ev := next(); ev.GetId() != 1 || string(ev.GetStdout()) != "go\n" {
		t.Fatalf("got %v, want the run's output", ev)
	}
	send(&runnerv1.Request{Id: 2, Kind: &runnerv1.Request_ListFiles{ListFiles: &runnerv1.ListFiles{}}})
	if ev := next(); ev.GetId() != 2 || ev.GetError().GetCode() != runnerv1.Error_CODE_BUSY {
		t.Fatalf("got %v, want BUSY for request 2", ev)
	}
	send(&runnerv1.Request{Id: 3, Kind: &runnerv1.Request_Cancel{Cancel: &runnerv1.Cancel{RunId: 1}}})
	if ev := next(); ev.GetId() != 1 || ev.GetExit().GetCode() != 137 {
		t.Fatalf("got %v, want the Exit of run 1", ev)
	}
	send(&runnerv1.Request{Id: 4, Kind: &runnerv1.Request_ListFiles{ListFiles: &runnerv1.ListFiles{}}})
	if ev := next(); ev.GetId() != 4 || ev.GetFileList() == nil {
		t.Fatalf("got %v, want the file list", ev)
	}
	reqW.Close()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
}

func TestFiles(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := t.Context()
	outside := filepath.Join(filepath.Dir(h.ws), "outside.txt")
	if err := os.WriteFile(outside, []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	// User code plants links and a FIFO.
	setup := fmt.Sprintf("ln -s %s out-file; ln -s %s out-dir; ln -s inner.txt in-link; echo inner > inner.txt; mkfifo fifo; mkdir sub",
		outside, filepath.Dir(h.ws))
	if r := h.mustRun("bash", setup); r.exit.GetCode() != 0 {
		t.Fatalf("setup: %v %s", r.exit, r.stderr)
	}

	filesWriteAndRead(t, h)
	filesList(t, h)

	refused := []struct {
		name string
		op   func() error
		want error
	}{
		{"read parent", func() error { _, err := h.c.ReadFile(ctx, "../outside.txt", 0); return err }, wire.ErrInvalidArgument},
		{"read absolute", func() error { _, err := h.c.ReadFile(ctx, outside, 0); return err }, wire.ErrInvalidArgument},
		{"read workspace itself", func() error { _, err := h.c.ReadFile(ctx, "", 0); return err }, wire.ErrInvalidArgument},
		{"write parent", func() error {
			return h.c.WriteFile(ctx, &runnerv1.File{Path: "a/../../x", Content: []byte("x")})
		}, wire.ErrInvalidArgument},
		{"read through link to a file outside", func() error { _, err := h.c.ReadFile(ctx, "out-file", 0); return err }, wire.ErrFailedPrecondition},
		{"write through link to a file outside", func() error {
			return h.c.WriteFile(ctx, &runnerv1.File{Path: "out-file", Content: []byte("pwned")})
		}, wire.ErrFailedPrecondition},
		{"write through link to a directory outside", func() error {
			return h.c.WriteFile(ctx, &runnerv1.File{Path: "out-dir/pwned.txt", Content: []byte("pwned")})
		}, wire.ErrFailedPrecondition},
		{"list through link to a directory outside", func() error { _, err := h.c.ListFiles(ctx, "out-dir"); return err }, wire.ErrFailedPrecondition},
		{"read FIFO", func() error { _, err := h.c.ReadFile(ctx, "fifo", 0); return err }, wire.ErrFailedPrecondition},
		{"write FIFO", func() error { return h.c.WriteFile(ctx, &runnerv1.File{Path: "fifo", Content: []byte("x")}) }, wire.ErrFailedPrecondition},
		{"read directory", func() error { _, err := h.c.ReadFile(ctx, "sub", 0); return err }, wire.ErrFailedPrecondition},
		{"write onto directory", func() error { return h.c.WriteFile(ctx, &runnerv1.File{Path: "sub", Content: []byte("x")}) }, wire.ErrFailedPrecondition},
		{"write under a file", func() error {
			return h.c.WriteFile(ctx, &runnerv1.File{Path: "inner.txt/x", Content: []byte("x")})
		}, wire.ErrFailedPrecondition},
		{"read missing", func() error { _, err := h.c.ReadFile(ctx, "nope", 0); return err }, wire.ErrNotFound},
		{"list missing", func() error { _, err := h.c.ListFiles(ctx, "nope"); return err }, wire.ErrNotFound},
		{"read above max", func() error { _, err := h.c.ReadFile(ctx, "inner.txt", 3); return err }, wire.ErrResourceExhausted},
		{"write too large", func() error {
			return h.c.WriteFile(ctx, &runnerv1.File{Path: "big", Content: make([]byte, wire.MaxFileSize+1)})
		}, wire.ErrResourceExhausted},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.name != "read absolute" && strings.Contains(err.Error(), filepath.Dir(h.ws)) {
				t.Fatalf("error %q shows a host path", err)
			}
		})
	}
	if b, _ := os.ReadFile(outside); string(b) != "secret" {
		t.Fatalf("the file outside the workspace changed: %q", b)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(h.ws), "pwned.txt")); err == nil {
		t.Fatal("a file was written outside the workspace")
	}
}

// filesWriteAndRead is TestFiles's writes and reads that succeed: owners,
// modes, the user's own changes, an overwrite and a link inside.
func filesWriteAndRead(t *testing.T, h *harness) {
	ctx := t.Context()
	if err := h.c.WriteFile(ctx, &runnerv1.File{Path: "a/b/c.txt", Content: []byte("hello"), Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	f, err := h.c.ReadFile(ctx, "a/b/c.txt", 0)
	if err != nil || string(f.GetContent()) != "hello" || f.GetMode() != 0o600 || f.GetPath() != "a/b/c.txt" {
		t.Fatalf("ReadFile = %v, %v", f, err)
	}
	if isRoot() {
		for _, p := range []string{"a", "a/b", "a/b/c.txt"} {
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(h.ws, p), &st); err != nil || int(st.Uid) != h.uid || int(st.Gid) != h.uid {
				t.Fatalf("%s owned by %d:%d (%v), want the user %d", p, st.Uid, st.Gid, err, h.uid)
			}
		}
	}
	// The user can change what the runner wrote.
	if r := h.mustRun("bash", "echo more >> a/b/c.txt && cat a/b/c.txt"); r.stdout != "hellomore\n" {
		t.Fatalf("user append: %q %q", r.stdout, r.stderr)
	}
	// Overwrite truncates.
	if err := h.c.WriteFile(ctx, &runnerv1.File{Path: "a/b/c.txt", Content: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if f, _ := h.c.ReadFile(ctx, "a/b/c.txt", 0); string(f.GetContent()) != "x" || f.GetMode() != 0o644 {
		t.Fatalf("after overwrite: %v", f)
	}
	// A link that stays inside the workspace is fine.
	if f, err := h.c.ReadFile(ctx, "in-link", 0); err != nil || string(f.GetContent()) != "inner\n" {
		t.Fatalf("ReadFile(in-link) = %v, %v", f, err)
	}
}

// filesList is TestFiles's listings of the workspace as its setup and
// filesWriteAndRead left it.
func filesList(t *testing.T, h *harness) {
	ctx := t.Context()
	l, err := h.c.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, fi := range l.GetFiles() {
		names = append(names, fmt.Sprintf("%s:%v", fi.GetPath(), fi.GetDir()))
	}
	if got, want := strings.Join(names, " "), "a:true fifo:false in-link:false inner.txt:false out-dir:false out-file:false outputs:true sub:true"; got != want {
		t.Fatalf("List = %s, want %s", got, want)
	}
	if l, err := h.c.List(ctx, "a/b"); err != nil || len(l.GetFiles()) != 1 || l.GetFiles()[0].GetPath() != "a/b/c.txt" || l.GetFiles()[0].GetSize() != 1 {
		t.Fatalf("List(a/b) = %v, %v", l, err)
	}
}

// Files of a run are written before it starts.
func TestRunFiles(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.run(t.Context(), &runnerv1.Run{Language: "python", Code: "import data.values as v; print(open('in.txt').read() + str(v.X))",
		Files: []*runnerv1.File{{Path: "in.txt", Content: []byte("n=")}, {Path: "data/values.py", Content: []byte("X = 7\n")}}})
	if r.err != nil || r.stdout != "n=7\n" {
		t.Fatalf("run = %q %q %v", r.stdout, r.stderr, r.err)
	}
	r = h.run(t.Context(), &runnerv1.Run{Language: "python", Code: "print(1)", Files: []*runnerv1.File{{Path: "../x"}}})
	if !errors.Is(r.err, wire.ErrInvalidArgument) {
		t.Fatalf("run with a bad file path = %v", r.err)
	}
}

func TestReset(t *testing.T) {
	if !isRoot() {
		testenv.Missing(t, "Reset kills processes by uid: needs root to run user code under a uid of its own")
	}
	t.Parallel()
	h := newHarness(t)
	ctx := t.Context()
	// Processes that escape the run's process group and session in every
	// usual way, and files in every writable place.
	code := fmt.Sprintf(`
cd %[1]s && mkdir -p d/e && echo x > d/e/f && chmod 000 d
echo t > %[2]s/t; mkdir %[2]s/dir; echo s > %[3]s/s
setsid sleep 3600 &
nohup sleep 3600 >/dev/null 2>&1 &
(sleep 3600 &) &
python3 -c 'import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        import time; time.sleep(3600)
' &
sleep 0.3
`, h.ws, h.tmp, h.shm)
	// System V IPC objects outlive their processes.
	const shm = "import ctypes; libc = ctypes.CDLL(None); print('shm', libc.shmget(0x5eed0000 + %d, %d, %s) >= 0)"
	if r := h.mustRun("python", fmt.Sprintf(shm, h.uid, 4096, "0o1600")); r.stdout != "shm True\n" {
		t.Fatalf("create shm: %q %q", r.stdout, r.stderr)
	}
	// As a session's run: a stateless run's leftovers die with it already
	// (TestRunSweep); Reset must also clean up after sessions.
	if r := h.run(ctx, &runnerv1.Run{Language: "bash", Code: code, Stateful: true}); r.err != nil || r.exit.GetCode() != 0 {
		t.Fatalf("setup: %v %s %v", r.exit, r.stderr, r.err)
	}
	// Stateful interpreters too.
	if r := h.run(ctx, &runnerv1.Run{Language: "python", Code: "secret = 1", Stateful: true}); r.err != nil {
		t.Fatal(r.err)
	}
	ps, err := h.s.procs.UserProcs(0)
	if err != nil || len(ps) < 5 {
		t.Fatalf("before reset: %d user processes (%v), want at least 5", len(ps), err)
	}
	if err := h.c.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if ps := h.userProcsBesidesPrestarted(); len(ps) > 0 {
		t.Fatalf("after reset: user processes %v", ps)
	}
	for _, d := range []string{h.ws, h.tmp, h.shm} {
		if names, _ := rawfile.Names(d); len(names) > 0 {
			t.Fatalf("after reset: %s holds %v", d, names)
		}
	}
	r := h.run(ctx, &runnerv1.Run{Language: "python", Code: "print(secret)", Stateful: true})
	if r.err != nil || !strings.Contains(r.stderr, "NameError") {
		t.Fatalf("after reset the session state survived: %q %q %v", r.stdout, r.stderr, r.err)
	}
	if r := h.mustRun("python", fmt.Sprintf(shm, h.uid, 0, "0")); r.stdout != "shm False\n" {
		t.Fatalf("after reset the shm segment survived: %q %q", r.stdout, r.stderr)
	}
}

// A stateless run's background processes end with it; a session's run
// keeps them.
func TestRunSweep(t *testing.T) {
	if !isRoot() {
		testenv.Missing(t, "finding the user's processes needs a uid of their own, which needs root")
	}
	t.Parallel()
	h := newHarness(t)
	code := "setsid sleep 3600 & nohup sleep 3600 >/dev/null 2>&1 & (sleep 3600 &) &"
	if r := h.mustRun("bash", code); r.exit.GetCode() != 0 {
		t.Fatalf("run: %v %s", r.exit, r.stderr)
	}
	if ps, _ := h.s.procs.UserProcs(0); len(ps) > 0 {
		t.Fatalf("after a stateless run: user processes %v", ps)
	}
	if r := h.run(t.Context(), &runnerv1.Run{Language: "bash", Code: code, Stateful: true}); r.err != nil || r.exit.GetCode() != 0 {
		t.Fatalf("run: %v %s %v", r.exit, r.stderr, r.err)
	}
	// The run returns while its background shells may still be forking
	// their sleeps: wait for the three.
	var ps []proc.UserProc
	testkit.Until(10*time.Second, func() bool {
		ps, _ = h.s.procs.UserProcs(0)
		return len(ps) == 3
	})
	if len(ps) != 3 {
		t.Fatalf("after a session's run: user processes %v, want the 3 sleeps", ps)
	}
}

// leftover is Python that prints whether a process with arg in its command
// line is alive, and x.
func leftover(arg string) string {
	return "import os\nalive = False\nfor p in os.listdir('/proc'):\n" +
		"    if p.isdigit() and int(p) != os.getpid():\n" +
		"        try: alive = alive or b'" + arg + "' in open('/proc/%s/cmdline' % p, 'rb').read()\n" +
		"        except OSError: pass\n" +
		"print(alive, x)"
}

func TestStatefulPython(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	ctx := t.Context()
	cell := func(code string, timeout time.Duration) result {
		t.Helper()
		r := h.run(ctx, &runnerv1.Run{Language: "python", Code: code, Stateful: true, Timeout: durationpb.New(timeout)})
		if r.err != nil {
			t.Fatalf("cell %q: %v", code, r.err)
		}
		return r
	}
	steps := []struct {
		code           string
		timeout        time.Duration
		stdout, stderr string // stderr: substring
		code32         int32
		stateLost      bool
	}{
		{code: "x = 41", stdout: ""},
		{code: "print(x + 1)", stdout: "42\n"},
		{code: "import math\ndef area(r):\n    return math.pi * r * r", stdout: ""},
		{code: "round(area(2), 3)", stdout: "12.566\n"}, // a final expression is shown
		{code: "None", stdout: ""},
		{code: "x += 1\nraise ValueError('boom')", stderr: "ValueError: boom", code32: 1},
		{code: "x", stdout: "42\n"}, // state survives an exception
		{code: "import sys; print('to err', file=sys.stderr); sys.exit(7)", stderr: "to err", code32: 7},
		{code: "import sys; print(sys.stdin.read())", stdout: "\n"},
		{code: "import os; print(os.getpid() == os.getpgrp(), __name__)", stdout: "True __main__\n"},
		// A cell that times out is interrupted, and the session keeps its
		// state; one that ignores the interrupt is killed with it.
		{code: "x += 1\nwhile True: pass", timeout: 300 * time.Millisecond, stderr: "KeyboardInterrupt", code32: 1},
		{code: "x", stdout: "43\n"},
		// What the interrupted cell started is killed; the kernel stays.
		{code: "import subprocess\nsubprocess.Popen(['sleep', '27182818'])\nwhile True: pass", timeout: 300 * time.Millisecond, stderr: "state is kept", code32: 1},
		{code: leftover("27182818"), stdout: "False 43\n"},
		{code: "import time\ntime.sleep(30)", timeout: 300 * time.Millisecond, stderr: "the Python session's state is kept", code32: 1},
		{code: "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass", timeout: 300 * time.Millisecond,
			stderr: "state (variables, imports, functions) was lost", code32: 137, stateLost: true},
		{code: "print('x' in dir())", stdout: "False\n"}, // a fresh interpreter
		{code: "y = 5\nimport os; os._exit(9)", code32: 9, stateLost: true, stderr: "the interpreter exited"},
		{code: "print('y' in dir())", stdout: "False\n"},
		{code: "def f(:", stderr: "SyntaxError", code32: 1},
	}
	for i, st := range steps {
		to := st.timeout
		if to == 0 {
			to = 20 * time.Second
		}
		r := cell(st.code, to)
		if r.stdout != st.stdout || !strings.Contains(r.stderr, st.stderr) || r.exit.GetCode() != st.code32 || r.exit.GetStateLost() != st.stateLost {
			t.Fatalf("step %d %q: code %d, stdout %q, stderr %q, state lost %v; want %d, %q, containing %q, %v",
				i, st.code, r.exit.GetCode(), r.stdout, r.stderr, r.exit.GetStateLost(), st.code32, st.stdout, st.stderr, st.stateLost)
		}
	}
	// Tracebacks name the cell and show its line, not the kernel's frames.
	r := cell("def g():\n    return 1/0\ng()", 20*time.Second)
	if strings.Contains(r.stderr, "<string>") || !strings.Contains(r.stderr, "return 1/0") {
		t.Fatalf("traceback: %s", r.stderr)
	}
	// stdin reaches a cell.
	r = h.run(ctx, &runnerv1.Run{Language: "python", Code: "print(input()[::-1])", Stdin: []byte("abc\n"), Stateful: true})
	if r.stdout != "cba\n" {
		t.Fatalf("stdin cell: %q %q %v", r.stdout, r.stderr, r.err)
	}
	// A stateless run does not see the session's state.
	if got := h.mustRun("python", "print('x' in dir())").stdout; got != "False\n" {
		t.Fatalf("stateless run: %q", got)
	}
}

func TestStatefulShell(t *testing.T) {
	t.Parallel()
	for _, lang := range []string{"bash", "sh"} {
		t.Run(lang, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			run := func(code string) result {
				t.Helper()
				r := h.run(t.Context(), &runnerv1.Run{Language: lang, Code: code, Stateful: true})
				if r.err != nil {
					t.Fatal(r.err)
				}
				return r
			}
			run("mkdir -p 'a b/c' && cd 'a b/c' && export GREETING=\"it's \\\"quoted\\\"\" && LOCAL=1")
			// bash keeps unexported variables too; sh only exported ones.
			local := "unset"
			if lang == "bash" {
				local = "1"
			}
			if r := run("pwd; echo \"$GREETING\"; echo \"${LOCAL:-unset}\""); r.stdout != h.ws+"/a b/c\nit's \"quoted\"\n"+local+"\n" || r.stderr != "" {
				t.Fatalf("state not kept: %q %q", r.stdout, r.stderr)
			}
			run("cd ..; unset GREETING; exit 3")
			if r := run("pwd; echo \"${GREETING:-gone}\""); r.stdout != h.ws+"/a b\ngone\n" {
				t.Fatalf("state after exit 3: %q %q", r.stdout, r.stderr)
			}
			if lang == "bash" {
				// Functions, arrays, attributes and odd values, but none
				// of bash's own variables, and no noise on stderr.
				run("greet() { echo \"hello $1\"; }; declare -a list=(one 'two words'); declare -A map=([k]=v); declare -i n=41; multi=$'line1\\nline2'; readonly FIXED=1; RANDOM=7")
				r := run("greet bob; echo \"${list[1]} ${map[k]} $((n+1))\"; printf '%s|' \"$multi\"; echo; echo \"${FIXED:-no}\"")
				if want := "hello bob\ntwo words v 42\nline1\nline2|\n1\n"; r.stdout != want || r.stderr != "" {
					t.Fatalf("bash state: %q %q, want %q", r.stdout, r.stderr, want)
				}
			}
			// A run killed at its timeout keeps the previous state.
			r := h.run(t.Context(), &runnerv1.Run{Language: lang, Code: "cd /; sleep 3600", Stateful: true, Timeout: durationpb.New(300 * time.Millisecond)})
			if !r.exit.GetTimedOut() {
				t.Fatalf("exit = %v", r.exit)
			}
			if r := run("pwd"); r.stdout != h.ws+"/a b\n" {
				t.Fatalf("after a timeout: %q", r.stdout)
			}
		})
	}
}
