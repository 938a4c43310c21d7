package runner

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/agent/internal/runner/ipc"
	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	"github.com/codemode-go/codemode/internal/hugepages"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
	"github.com/codemode-go/codemode/internal/testkit/testlog"
)

// The tests in this file start the real runner binary (static, as the agent
// mounts it) in real gVisor sandboxes with the docker CLI, shaped as the
// contract in package wire says, and drive it with wire.Client over the
// container's attached stdin and stdout.

var (
	buildOnce  sync.Once
	runnerBin  string
	buildErr   error
	sandboxSeq atomic.Int32
)

// buildRunner builds the runner binary once, static.
func buildRunner(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "runner-bin-")
		if err != nil {
			buildErr = err
			return
		}
		runnerBin = filepath.Join(dir, "runner")
		cmd := exec.Command("go", "build", "-trimpath", "-o", runnerBin, "github.com/codemode-go/codemode/agent/cmd/runner")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build runner: %v: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return runnerBin
}

type sandbox struct {
	t    testing.TB
	name string
	c    *wire.Client
	log  *testlog.Buffer // the runner's stderr
}

// startSandbox starts a runsc container whose entry process is the runner,
// with the flags of the contract, and waits for Ready.
func startSandbox(t testing.TB) *sandbox {
	t.Helper()
	dockertest.Need(t)
	return startSandboxBin(t, buildRunner(t))
}

// startSandboxBin is startSandbox with the runner binary bin.
func startSandboxBin(t testing.TB, bin string) *sandbox {
	t.Helper()
	return startSandboxOpts(t, bin, "256m")
}

// startSandboxOpts is startSandboxBin with a memory limit and more runner
// flags.
func startSandboxOpts(t testing.TB, bin, memory string, flags ...string) *sandbox {
	t.Helper()
	dockertest.Need(t)
	name := fmt.Sprintf("codemode-runner-test-%d-%d", os.Getpid(), sandboxSeq.Add(1))
	args := []string{"run", "-i", "--rm", "--name", name,
		"--runtime=runsc", "--network=none", "--read-only",
		"--tmpfs", "/workspace:size=64m", "--tmpfs", "/tmp:size=16m",
		"--tmpfs", wire.UserLib + ":size=1m",
		// The agent's default pids limit: 128 held a fork bomb on a quiet
		// host but not always with the host saturated (see wire's notes).
		"--memory=" + memory, "--pids-limit=256", "--cpus=1",
		"--cap-drop=ALL", "--security-opt=no-new-privileges", "--user=0:0",
		"--label=codemode.test=runner",
		"-v", bin + ":" + wire.RunnerPath + ":ro", "--entrypoint", wire.RunnerPath,
	}
	for _, c := range wire.RunnerCapabilities {
		args = append(args, "--cap-add="+c)
	}
	args = append(args, dockertest.Image())
	args = append(args, flags...)
	// RUNNER_TEST_DEBUG=1 logs the runner's debug log (with the timings of
	// its steps) at the end of every test or benchmark.
	debug := os.Getenv("RUNNER_TEST_DEBUG") != ""
	if debug {
		args = append(args, "-log-level=debug")
	}
	cmd := exec.Command("docker", args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	sb := &sandbox{t: t, name: name, log: &testlog.Buffer{}}
	cmd.Stderr = sb.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sb.c = wire.NewClient(stdout, stdin)
	t.Cleanup(func() {
		stdin.Close() // the runner sees EOF, exits, and --rm removes the container
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			exec.Command("docker", "rm", "-f", name).Run()
			<-done
		}
		if t.Failed() || debug {
			t.Logf("runner log of %s:\n%s", name, sb.log.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := sb.c.Ready(ctx); err != nil {
		t.Fatalf("sandbox %s not ready: %v\n%s", name, err, sb.log.String())
	}
	return sb
}

// countUserProcs is Python that prints how many processes of the user
// there are besides itself.
const countUserProcs = "import os; print(sum(1 for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid() and os.stat('/proc/' + p).st_uid == os.getuid()))"

func (sb *sandbox) run(ctx context.Context, r *runnerv1.Run) result {
	sb.t.Helper()
	if r.Timeout == nil {
		r.Timeout = durationpb.New(30 * time.Second)
	}
	var out, errb bytes.Buffer
	exit, err := sb.c.Run(ctx, r, func(s wire.Stream, b []byte) {
		if s == wire.Stdout {
			out.Write(b)
		} else {
			errb.Write(b)
		}
	})
	return result{exit: exit, stdout: out.String(), stderr: errb.String(), err: err}
}

func (sb *sandbox) mustRun(t *testing.T, lang, code string) result {
	t.Helper()
	r := sb.run(t.Context(), &runnerv1.Run{Language: lang, Code: code})
	if r.err != nil {
		t.Fatalf("run %s %q: %v", lang, code, r.err)
	}
	return r
}

// TestSandbox runs the runner in one gVisor sandbox through a sequence of
// checks; each leaves the sandbox usable for the next, which is itself
// part of what is checked.
func TestSandbox(t *testing.T) {
	t.Parallel()
	sb := startSandbox(t)
	ctx := t.Context()

	t.Run("languages", func(t *testing.T) {
		for _, tc := range []struct{ lang, code, want string }{
			{"python", "import os; print(os.getuid(), os.getgid(), os.getcwd())", fmt.Sprintf("%d %d /workspace\n", wire.UserUID, wire.UserGID)},
			{"bash", "echo $BASH_VERSION | cut -c1-2; id -u", "5.\n65534\n"},
			{"sh", "echo sh $HOME", "sh /workspace\n"},
			{"javascript", "console.log(process.getuid())", "65534\n"},
			{"python", bigCode("python"), "big 1\n"},
			{"javascript", bigCode("javascript"), "big 1\n"},
		} {
			if r := sb.mustRun(t, tc.lang, tc.code); r.stdout != tc.want || r.exit.GetCode() != 0 {
				t.Errorf("%s %.40q: code %d, stdout %q, stderr %q; want %q", tc.lang, tc.code, r.exit.GetCode(), r.stdout, r.stderr, tc.want)
			}
		}
	})

	t.Run("no privileges", func(t *testing.T) {
		r := sb.mustRun(t, "bash", "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status | tr -s '\\t' ' '")
		t.Logf("user code's status:\n%s", r.stdout)
		for _, want := range []string{"CapPrm: 0000000000000000", "CapEff: 0000000000000000", "NoNewPrivs: 1"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("user code's status lacks %q:\n%s", want, r.stdout)
			}
		}
	})

	t.Run("streams", func(t *testing.T) {
		sandboxStreams(t, sb)
	})

	t.Run("runner protected", func(t *testing.T) {
		sandboxRunnerProtected(t, sb)
	})

	t.Run("no network", func(t *testing.T) {
		r := sb.mustRun(t, "bash", "ls /sys/class/net 2>/dev/null || awk 'NR>2 {print $1}' /proc/net/dev")
		if strings.TrimSpace(strings.ReplaceAll(r.stdout, ":", "")) != "lo" {
			t.Fatalf("interfaces: %q", r.stdout)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		sandboxTimeout(t, sb)
	})

	t.Run("stdout flood", func(t *testing.T) {
		sandboxStdoutFlood(t, sb)
	})

	t.Run("stateful python", func(t *testing.T) {
		for _, c := range []struct{ code, want string }{{"x = 41", ""}, {"print(x + 1)", "42\n"}} {
			r := sb.run(ctx, &runnerv1.Run{Language: "python", Code: c.code, Stateful: true})
			if r.err != nil || r.stdout != c.want {
				t.Fatalf("%q: %q %q %v", c.code, r.stdout, r.stderr, r.err)
			}
		}
	})

	t.Run("bash session keeps cd", func(t *testing.T) {
		for _, c := range []struct{ code, want string }{{"mkdir -p /tmp/there && cd /tmp/there && export V=1", ""}, {"pwd; echo $V", "/tmp/there\n1\n"}} {
			r := sb.run(ctx, &runnerv1.Run{Language: "bash", Code: c.code, Stateful: true})
			if r.err != nil || r.stdout != c.want {
				t.Fatalf("%q: %q %q %v", c.code, r.stdout, r.stderr, r.err)
			}
		}
	})

	t.Run("matplotlib figures", func(t *testing.T) {
		sandboxMatplotlibFigures(t, sb)
	})

	t.Run("files", func(t *testing.T) {
		sandboxFiles(t, sb)
	})
}

// sandboxStreams is TestSandbox's "streams".
func sandboxStreams(t *testing.T, sb *sandbox) {
	ctx := t.Context()
	start := time.Now()
	var times []time.Duration
	exit, err := sb.c.Run(ctx, &runnerv1.Run{Language: "python", Code: "import time\nfor i in range(3):\n    print(i)\n    time.sleep(1)"},
		func(_ wire.Stream, b []byte) {
			for range bytes.Count(b, []byte("\n")) {
				times = append(times, time.Since(start))
			}
		})
	if err != nil || exit.GetCode() != 0 || len(times) != 3 {
		t.Fatalf("exit %v, err %v, lines at %v", exit, err, times)
	}
	t.Logf("lines arrived at %v", times)
	// The lines are printed 1 s apart. Buffering brings them all at
	// once; on a loaded machine one late line shortens its gap to the
	// next, so the bounds are loose.
	for i := 1; i < 3; i++ {
		if gap := times[i] - times[i-1]; gap < 250*time.Millisecond {
			t.Fatalf("line %d came %v after line %d: buffered output (times %v)", i, gap, i-1, times)
		}
	}
	if span := times[2] - times[0]; span < time.Second {
		t.Fatalf("the lines came within %v of each other: buffered output (times %v)", span, times)
	}
}

// sandboxRunnerProtected is TestSandbox's "runner protected".
func sandboxRunnerProtected(t *testing.T, sb *sandbox) {
	// The runner is PID 1 and root; user code is another uid.
	for _, tc := range []struct{ name, code string }{
		{"signal", "kill -KILL 1"},
		{"signal all", "kill -KILL -1; echo still here"},
		{"read memory", "head -c 16 /proc/1/mem"},
		{"read memory map", "cat /proc/1/maps"},
		{"read environment", "cat /proc/1/environ"},
		{"open its stdin", "echo x > /proc/1/fd/0"},
		{"trace", "python3 -c 'import ctypes, sys; r = ctypes.CDLL(None).ptrace(16, 1, 0, 0); sys.exit(0 if r == 0 else 1)'"},
		{"replace binary", "echo x > " + wire.RunnerPath},
		{"write the root", "echo x > /etc/passwd || echo x > /usr/bin/x"},
	} {
		r := sb.mustRun(t, "bash", tc.code)
		if tc.name == "signal all" {
			if r.stdout != "" { // kill -1 also killed the shell itself
				t.Logf("%s: %q", tc.name, r.stdout)
			}
			continue
		}
		if r.exit.GetCode() == 0 {
			t.Errorf("%s: user code succeeded (stdout %q)", tc.name, r.stdout)
		}
	}
	if r := sb.mustRun(t, "bash", "echo alive"); r.stdout != "alive\n" {
		t.Fatalf("runner after the attacks: %q %q", r.stdout, r.stderr)
	}
}

// sandboxTimeout is TestSandbox's "timeout".
func sandboxTimeout(t *testing.T, sb *sandbox) {
	ctx := t.Context()
	for _, tc := range []struct{ lang, code string }{
		{"bash", "sleep 3600"},
		{"python", "while True: pass"},
		{"bash", "setsid sleep 3600 & nohup sleep 3600 & (sleep 3600 &); sleep 3600"},
	} {
		start := time.Now()
		r := sb.run(ctx, &runnerv1.Run{Language: tc.lang, Code: tc.code, Timeout: durationpb.New(2 * time.Second)})
		if r.err != nil || !r.exit.GetTimedOut() || r.exit.GetCode() != 137 {
			t.Fatalf("%q: %v %v", tc.code, r.exit, r.err)
		}
		if d := time.Since(start); d > 6*time.Second {
			t.Fatalf("%q: took %v", tc.code, d)
		}
		if got := sb.mustRun(t, "python", countUserProcs).stdout; got != "0\n" {
			t.Fatalf("%q: user processes left after the timeout: %q", tc.code, got)
		}
	}
}

// sandboxStdoutFlood is TestSandbox's "stdout flood".
func sandboxStdoutFlood(t *testing.T, sb *sandbox) {
	ctx := t.Context()
	const limit = 1 << 20
	start := time.Now()
	r := sb.run(ctx, &runnerv1.Run{Language: "python", OutputLimit: limit, Timeout: durationpb.New(60 * time.Second),
		Code: "import sys\nb = b'x' * (1 << 20)\nfor _ in range(150):\n    sys.stdout.buffer.write(b)\nprint('end', file=sys.stderr)"})
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Logf("150 MiB flood: %v, exit %v", time.Since(start), r.exit)
	if got := len(r.stdout) + len(r.stderr); got != limit || !r.exit.GetTruncated() || r.exit.GetCode() != 0 {
		t.Fatalf("passed on %d bytes, exit %v", got, r.exit)
	}
	if got := sb.mustRun(t, "python", "print('responsive')").stdout; got != "responsive\n" {
		t.Fatalf("after the flood: %q", got)
	}
}

// sandboxMatplotlibFigures is TestSandbox's "matplotlib figures".
func sandboxMatplotlibFigures(t *testing.T, sb *sandbox) {
	ctx := t.Context()
	plot := "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\nplt.figure(); plt.bar([1, 2], [3, 4]); plt.show()"
	for _, stateful := range []bool{false, true} {
		r := sb.run(ctx, &runnerv1.Run{Language: "python", Code: plot, Stateful: stateful})
		if r.err != nil || r.exit.GetCode() != 0 {
			t.Fatalf("stateful %v: %v %q", stateful, r.err, r.stderr)
		}
		if r.stderr != "" {
			t.Errorf("stateful %v: stderr %q", stateful, r.stderr)
		}
		want := "figure-1.png image/png; figure-2.png image/png"
		if stateful {
			// The stateless run's figures are still there.
			want = "figure-3.png image/png; figure-4.png image/png"
		}
		if got := strings.Join(artifactNames(r.exit), "; "); got != want {
			t.Fatalf("stateful %v: artifacts %q, want %q", stateful, got, want)
		}
		for _, a := range r.exit.GetArtifacts() {
			if _, err := png.Decode(bytes.NewReader(a.GetContent())); err != nil {
				t.Errorf("%s: %v", a.GetName(), err)
			}
		}
	}
	// matplotlib reads the image's font list from its directory, which
	// is not the workspace, and searches no fonts (it would fail to
	// write the list there, and say so on stderr).
	r0 := sb.mustRun(t, "python", "import os, matplotlib.pyplot as plt, matplotlib\n"+
		"d = os.environ['MPLCONFIGDIR']\nprint(matplotlib.get_cachedir() == d, [n.split('-v')[0] for n in os.listdir(d)], [n for n in os.listdir('/workspace') if n.startswith('.')])")
	if want := "True ['fontlist'] []\n"; r0.stdout != want || r0.stderr != "" {
		t.Errorf("matplotlib's directory: %q %q, want %q", r0.stdout, r0.stderr, want)
	}
	// The modules are root's: user code cannot change what the next
	// run's plt.show() does.
	r := sb.mustRun(t, "bash", "stat -c '%U %a' "+wire.UserLib+" "+wire.UserLib+"/*; echo x > "+wire.UserLib+"/codemode_mpl.py || echo refused")
	if want := "root 755\nroot 644\n"; !strings.HasPrefix(r.stdout, want) || !strings.HasSuffix(r.stdout, "refused\n") {
		t.Errorf("python lib: %q %q", r.stdout, r.stderr)
	}
}

// sandboxFiles is TestSandbox's "files".
func sandboxFiles(t *testing.T, sb *sandbox) {
	ctx := t.Context()
	if err := sb.c.WriteFile(ctx, &runnerv1.File{Path: "in/data.txt", Content: []byte("42")}); err != nil {
		t.Fatal(err)
	}
	r := sb.mustRun(t, "bash", "stat -c '%U %a' in in/data.txt; cat in/data.txt > out.txt; ln -s /etc/passwd leak")
	if r.stdout != "nobody 755\nnobody 644\n" {
		t.Fatalf("owners: %q %q", r.stdout, r.stderr)
	}
	f, err := sb.c.ReadFile(ctx, "out.txt", 0)
	if err != nil || string(f.GetContent()) != "42" {
		t.Fatalf("ReadFile = %v, %v", f, err)
	}
	if _, err := sb.c.ReadFile(ctx, "leak", 0); err == nil {
		t.Fatal("read through a link out of the workspace")
	}
}

// TestSandboxReset checks that a scrubbed sandbox shows nothing of the
// runs before: processes that left the run's process group and session,
// files in every writable place (matplotlib's directory holds the image's
// font list again), System V shared memory, session state.
func TestSandboxReset(t *testing.T) {
	t.Parallel()
	sb := startSandbox(t)
	ctx := t.Context()
	a := `
cd /workspace && echo a > a.txt && echo a > outputs/a.txt && mkdir -p d/e && echo x > d/e/f && chmod 000 d
echo t > /tmp/t; mkdir /tmp/dir; echo s > /dev/shm/s
echo 'font.size: 99' > "$MPLCONFIGDIR/matplotlibrc"; f=$(ls "$MPLCONFIGDIR"/fontlist-*); mv "$f" "$MPLCONFIGDIR/old"; echo '{}' > "$f"
setsid sleep 3600 &
nohup sleep 3600 >/dev/null 2>&1 &
(sleep 3600 &) &
python3 -c '
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(3600)
' &
python3 -c '
import ctypes, os
libc = ctypes.CDLL(None)
# Push the ids past where a scan of the first few hundred would look.
for i in range(600):
    libc.shmctl(libc.shmget(0, 4096, 0o1600), 0, None)
    libc.msgctl(libc.msgget(0, 0o1600), 0, None)
    libc.semctl(libc.semget(0, 1, 0o1600), 0, 0, None)
print("shm", libc.shmget(0x5eed, 4096, 0o1600) >= 0, libc.msgget(0x5eed, 0o1600) >= 0, libc.semget(0x5eed, 1, 0o1600) >= 0)
# POSIX message queues, which have no file in the sandbox (gVisor has no
# mq_send: the names carry the data).
print("mq", sum(libc.mq_open(b"/codemode-reset-%d" % i, os.O_CREAT | os.O_RDWR, ctypes.c_uint(0o666), None) >= 0 for i in range(100)))
'
sleep 0.5
ls /proc | grep -c '^[0-9]'
`
	// As a session's run: a stateless run's leftovers die with it already.
	r := sb.run(ctx, &runnerv1.Run{Language: "bash", Code: a, Stateful: true})
	if r.err != nil || !strings.Contains(r.stdout, "shm True True True\nmq 100\n") {
		t.Fatalf("run A: %q %q", r.stdout, r.stderr)
	}
	if r := sb.run(ctx, &runnerv1.Run{Language: "python", Code: "secret = 'A'", Stateful: true}); r.err != nil {
		t.Fatal(r.err)
	}
	start := time.Now()
	if err := sb.c.Reset(ctx); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	t.Logf("Reset took %v", time.Since(start))
	b := `
ls -A /workspace /workspace/outputs /tmp /dev/shm
ls -A "$MPLCONFIGDIR" | sed 's/-v[0-9]*//'; cmp "$MPLCONFIGDIR"/fontlist-* /usr/share/codemode/matplotlib/fontlist-* && echo same font list
for p in /proc/[0-9]*; do [ "$(stat -c %U $p)" = nobody ] && [ "${p#/proc/}" != "$$" ] && [ "${p#/proc/}" != "$BASHPID" ] && echo "proc $(cat $p/cmdline | tr '\0' ' ')"; done
pwd
python3 -c '
import ctypes, os
libc = ctypes.CDLL(None)
print("shm", libc.shmget(0x5eed, 0, 0) >= 0, libc.msgget(0x5eed, 0) >= 0, libc.semget(0x5eed, 0, 0) >= 0)
print("mq", sum(libc.mq_open(b"/codemode-reset-%d" % i, os.O_RDONLY) >= 0 for i in range(100)))
'
`
	r = sb.mustRun(t, "bash", b)
	// outputs is made (empty) before every run.
	// matplotlib's directory holds the image's font list again, and only it.
	want := "/dev/shm:\n\n/tmp:\n\n/workspace:\noutputs\n\n/workspace/outputs:\nfontlist.json\nsame font list\n/workspace\nshm False False False\nmq 0\n"
	// The loop's own subshells may show up as "proc bash ..."; nothing else may.
	var lines []string
	for _, l := range strings.Split(r.stdout, "\n") {
		if strings.HasPrefix(l, "proc ") && (strings.HasPrefix(l, "proc bash") || strings.HasPrefix(l, "proc cat") || strings.HasPrefix(l, "proc stat") || strings.HasPrefix(l, "proc tr")) {
			continue
		}
		lines = append(lines, l)
	}
	if got := strings.Join(lines, "\n"); got != want {
		t.Fatalf("run B after Reset sees:\n%s\nstderr %s\nwant:\n%s", got, r.stderr, want)
	}
	r = sb.run(ctx, &runnerv1.Run{Language: "python", Code: "print(secret)", Stateful: true})
	if !strings.Contains(r.stderr, "NameError") {
		t.Fatalf("session state after Reset: %q %q", r.stdout, r.stderr)
	}
}

// TestSandboxResetTooManyQueues checks that Reset fails, rather than take
// seconds, after a run made more POSIX message queues than it removes one by
// one (gVisor sets no limit); the agent then replaces the sandbox.
func TestSandboxResetTooManyQueues(t *testing.T) {
	t.Parallel()
	sb := startSandbox(t)
	code := fmt.Sprintf(`
import ctypes, os
libc = ctypes.CDLL(None)
print(sum(libc.mq_open(b"/q%%d" %% i, os.O_CREAT | os.O_RDWR, ctypes.c_uint(0o600), None) >= 0 for i in range(%d)))
`, ipc.MaxMqueues+1)
	if r := sb.mustRun(t, "python", code); r.stdout != fmt.Sprintf("%d\n", ipc.MaxMqueues+1) {
		t.Fatalf("create queues: %q %q", r.stdout, r.stderr)
	}
	err := sb.c.Reset(t.Context())
	if err == nil || !strings.Contains(err.Error(), "message queues") {
		t.Fatalf("Reset = %v, want an error about message queues", err)
	}
}

// TestSandboxPrestart checks, under gVisor, that stateless Python runs after
// a start or a Reset are served by a prestarted interpreter, and that the
// prestart follows the language of the sandbox's runs.
func TestSandboxPrestart(t *testing.T) {
	t.Parallel()
	sb := startSandbox(t)
	ctx := t.Context()
	// A prestarted interpreter runs the code from its launcher's frame.
	const which = "import sys; f = sys._getframe().f_back; print(f.f_code.co_name if f else 'cold')"
	step := func(want string) {
		t.Helper()
		if r := sb.mustRun(t, "python", which); r.stdout != want+"\n" {
			t.Fatalf("got %q (stderr %q), want %s", r.stdout, r.stderr, want)
		}
	}
	reset := func() {
		t.Helper()
		if err := sb.c.Reset(ctx); err != nil {
			t.Fatal(err)
		}
	}
	step("_codemode_prestart") // prestarted before Ready
	step("cold")               // one interpreter per run
	reset()
	step("_codemode_prestart")
	reset()
	sb.mustRun(t, "bash", "true") // discards it, and stops prestarting
	reset()
	step("cold")
	reset()
	step("_codemode_prestart")

	// Node.js: a prestarted one runs the code through its launcher's vm
	// call, which shows in a stack trace.
	const whichJS = `console.log(new Error().stack.includes("at Script.runInThisContext") ? "prestarted" : "cold")`
	stepJS := func(want string) {
		t.Helper()
		if r := sb.mustRun(t, "javascript", whichJS); r.stdout != want+"\n" {
			t.Fatalf("javascript: got %q (stderr %q), want %s", r.stdout, r.stderr, want)
		}
	}
	reset()
	stepJS("cold") // Python was prestarted
	reset()
	stepJS("prestarted")
	reset()
	step("cold") // node was prestarted
}

// TestSandboxAbuse: each abuse ends its run only, with a clear result, and
// the next run in the same sandbox works.
func TestSandboxAbuse(t *testing.T) {
	t.Parallel()
	sb := startSandbox(t)
	ctx := t.Context()
	next := func(t *testing.T) {
		t.Helper()
		if r := sb.mustRun(t, "python", "print('next')"); r.stdout != "next\n" {
			t.Fatalf("next run: %q %q %v", r.stdout, r.stderr, r.exit)
		}
	}
	t.Run("fork bomb", func(t *testing.T) {
		r := sb.run(ctx, &runnerv1.Run{Language: "bash", Code: ":(){ :|:& };:", Timeout: durationpb.New(3 * time.Second)})
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Logf("fork bomb: %v, stderr %.200q", r.exit, r.stderr)
		next(t)
	})
	t.Run("fork bomb left running, then reset", func(t *testing.T) {
		// A session's run keeps its background processes: the bomb is
		// still forking when Reset comes.
		r := sb.run(ctx, &runnerv1.Run{Language: "bash", Code: "(:(){ :|:& };:) >/dev/null 2>&1 & sleep 0.3; echo left", Stateful: true, Timeout: durationpb.New(10 * time.Second)})
		if r.err != nil || r.stdout != "left\n" {
			t.Fatalf("run: %v %q %q %v", r.exit, r.stdout, r.stderr, r.err)
		}
		start := time.Now()
		if err := sb.c.Reset(ctx); err != nil {
			t.Fatalf("Reset with a fork bomb running: %v", err)
		}
		t.Logf("reset with a fork bomb running took %v", time.Since(start))
		if r := sb.mustRun(t, "python", countUserProcs); r.stdout != "0\n" {
			t.Fatalf("user processes after Reset: %q %q", r.stdout, r.stderr)
		}
	})
	t.Run("memory bomb", func(t *testing.T) {
		// Under gVisor /proc/meminfo tells the cgroup's usage, and the
		// watchdog reads it near the limit (memoryFiles).
		if strings.Contains(sb.log.String(), meminfoUnusable) {
			t.Errorf("the runner warned %q\n%s", meminfoUnusable, sb.log.String())
		}
		r := sb.run(ctx, &runnerv1.Run{Language: "python", Code: "x = []\nwhile True:\n    x.append(bytearray(16 << 20))", Timeout: durationpb.New(30 * time.Second)})
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Logf("memory bomb: %v", r.exit)
		if !r.exit.GetOomKilled() || r.exit.GetCode() != 137 {
			t.Fatalf("exit = %v, want oom_killed", r.exit)
		}
		next(t)
	})
	t.Run("memory limit of the run", func(t *testing.T) {
		r := sb.run(ctx, &runnerv1.Run{Language: "python", MemoryLimit: 96 << 20, Stateful: true,
			Code: "x = []\nfor i in range(20):\n    x.append(bytearray(16 << 20))\n    print(i, flush=True)"})
		if r.err != nil {
			t.Fatal(r.err)
		}
		t.Logf("memory limit: %v, stdout %q", r.exit, r.stdout)
		if !r.exit.GetOomKilled() || !r.exit.GetStateLost() || strings.Contains(r.stdout, "19") {
			t.Fatalf("exit = %v, want oom_killed and state lost before the end", r.exit)
		}
		next(t)
	})
	t.Run("disk fill", func(t *testing.T) {
		r := sb.run(ctx, &runnerv1.Run{Language: "bash", Code: "cat /dev/zero > /workspace/fill; echo $?; rm /workspace/fill", Timeout: durationpb.New(30 * time.Second)})
		if r.err != nil || !strings.Contains(r.stderr, "No space left") {
			t.Fatalf("disk fill: %v %q %q %v", r.exit, r.stdout, r.stderr, r.err)
		}
		next(t)
	})
}

// What the memory watchdog falls back on when a fast allocator gets past it
// (RATIONALE.md, "Memory: a watchdog"): on this host, as agent/host/setup.sh
// leaves it, a large allocation past a runsc sandbox's memory limit ends the
// process that made it (SIGKILL from the gVisor kernel), not the sandbox.
// No runner here, so no watchdog: every bomb reaches the limit. It fails
// where gVisor commits sandbox memory by writing it (shmem_enabled advise
// with defrag defer: the host's OOM killer then takes the whole sandbox).
func TestSandboxLargeAllocationPastLimit(t *testing.T) {
	dockertest.Need(t)
	t.Parallel()
	bomb := "x = []\nwhile True:\n    x.append(bytearray(16 << 20))"
	script := fmt.Sprintf("for i in 1 2 3; do python3 -c '%s'; echo \"bomb $i: $?\"; done; echo survived", bomb)
	name := fmt.Sprintf("codemode-runner-test-%d-%d", os.Getpid(), sandboxSeq.Add(1))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", "run", "--rm", "--name", name,
		"--runtime=runsc", "--network=none", "--read-only", "--memory=128m", "--cpus=1",
		"--cap-drop=ALL", "--security-opt=no-new-privileges", "--label=codemode.test=runner",
		"--entrypoint", "sh", dockertest.Image(), "-c", script)
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		exec.Command("docker", "rm", "-f", name).Run()
	}
	want := "bomb 1: 137\nbomb 2: 137\nbomb 3: 137\nsurvived\n"
	if err != nil || !strings.HasSuffix(strings.ReplaceAll(string(out), "Killed\n", ""), want) {
		t.Fatalf("three memory bombs in one sandbox: %v\n%s\nwant each killed and the sandbox alive (host: transparent huge pages %s)", err, out, hugepages.Host().String())
	}
}

// BenchmarkSandbox measures, in one gVisor sandbox, what a run costs
// through the runner against the physical limit measured inside the same
// sandbox: a shell loop starting the same interpreter. Run with
//
//	go test -run '^$' -bench Sandbox -benchtime 50x ./agent/internal/runner
func BenchmarkSandbox(b *testing.B) {
	sb := startSandbox(b)
	ctx := b.Context()
	b.Run("runner/python-print", func(b *testing.B) {
		sb.benchRuns(b, &runnerv1.Run{Language: "python", Code: "print(1)"})
	})
	b.Run("runner/bash-echo", func(b *testing.B) {
		sb.benchRuns(b, &runnerv1.Run{Language: "bash", Code: "echo 1"})
	})
	// A stateless run and the scrub that makes the sandbox fit for the
	// next, unrelated one, as the agent's pool does them: wall time and the
	// CPU time the sandbox spends (cgroup accounting on the host, which
	// includes the gVisor kernel's own work).
	for _, lang := range []struct{ name, code string }{{"python", "print(1)"}, {"bash", "echo 1"}} {
		b.Run("runner/"+lang.name+"-run+reset", func(b *testing.B) {
			sb.benchRunReset(b, lang.name, lang.code)
		})
	}
	b.Run("runner/python-session-statement", func(b *testing.B) {
		if _, err := sb.c.Run(ctx, &runnerv1.Run{Language: "python", Code: "x = 0", Stateful: true}, nil); err != nil {
			b.Fatal(err)
		}
		sb.benchRuns(b, &runnerv1.Run{Language: "python", Code: "x += 1", Stateful: true})
	})
	// The same starts from a loop inside the sandbox: no runner, no
	// stream, only the interpreter.
	for _, tc := range []struct{ name, cmd string }{
		{"in-sandbox-loop/python-print", "python3 -c 'print(1)'"},
		{"in-sandbox-loop/bash-echo", "bash -c 'echo 1'"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			sb.benchInSandboxLoop(b, tc.cmd)
		})
	}
}

// benchRuns runs run over and over: latency and the sandbox's CPU time per
// run.
func (sb *sandbox) benchRuns(b *testing.B, run *runnerv1.Run) {
	ctx := b.Context()
	cpu := sb.cpuUsage(b)
	var lat []time.Duration
	c0 := cpu()
	for b.Loop() {
		start := time.Now()
		exit, err := sb.c.Run(ctx, run, nil)
		if err != nil || exit.GetCode() != 0 {
			b.Fatalf("run: %v %v", exit, err)
		}
		lat = append(lat, time.Since(start))
	}
	b.ReportMetric(float64((cpu()-c0).Microseconds())/1000/float64(len(lat)), "cpu-ms")
	testkit.ReportPercentiles(b, lat, time.Millisecond)
}

// benchRunReset is BenchmarkSandbox's "runner/<lang>-run+reset": a run of
// code in lang and a reset, each timed apart.
func (sb *sandbox) benchRunReset(b *testing.B, lang, code string) {
	ctx := b.Context()
	cpu := sb.cpuUsage(b)
	run := &runnerv1.Run{Language: lang, Code: code}
	var runW, runC, resW, resC time.Duration
	var lat []time.Duration
	n := 0
	for b.Loop() {
		c0, t0 := cpu(), time.Now()
		exit, err := sb.c.Run(ctx, run, nil)
		if err != nil || exit.GetCode() != 0 {
			b.Fatalf("run: %v %v", exit, err)
		}
		c1, t1 := cpu(), time.Now()
		if err := sb.c.Reset(ctx); err != nil {
			b.Fatalf("reset: %v", err)
		}
		c2, t2 := cpu(), time.Now()
		runW, runC = runW+t1.Sub(t0), runC+c1-c0
		resW, resC = resW+t2.Sub(t1), resC+c2-c1
		lat = append(lat, t1.Sub(t0))
		n++
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
	b.ReportMetric(ms(runW), "run-ms")
	b.ReportMetric(ms(runC), "run-cpu-ms")
	b.ReportMetric(ms(resW), "reset-ms")
	b.ReportMetric(ms(resC), "reset-cpu-ms")
	testkit.ReportPercentiles(b, lat, time.Millisecond)
}

// benchInSandboxLoop is BenchmarkSandbox's "in-sandbox-loop/...": cmd
// started from a bash loop in the sandbox.
func (sb *sandbox) benchInSandboxLoop(b *testing.B, cmd string) {
	ctx := b.Context()
	// Ten starts per run of the loop, so that the cost of the run
	// that holds the loop weighs little on the CPU time per start.
	const starts = 10
	cpu := sb.cpuUsage(b)
	var lat []time.Duration
	c0 := cpu()
	for b.Loop() {
		// bash's time keyword measures without starting anything
		// else.
		code := fmt.Sprintf("TIMEFORMAT=%%3R; for i in {1..%d}; do { time %s >/dev/null; } 2>&1; done", starts, cmd)
		exit, err := sb.c.Run(ctx, &runnerv1.Run{Language: "bash", Code: code}, func(_ wire.Stream, out []byte) {
			for f := range strings.FieldsSeq(string(out)) {
				var sec float64
				if _, err := fmt.Sscan(f, &sec); err == nil {
					lat = append(lat, time.Duration(sec*float64(time.Second)))
				}
			}
		})
		if err != nil || exit.GetCode() != 0 {
			b.Fatalf("run: %v %v", exit, err)
		}
	}
	b.ReportMetric(float64((cpu()-c0).Microseconds())/1000/float64(len(lat)), "cpu-ms")
	testkit.ReportPercentiles(b, lat, time.Millisecond)
}

// cpuUsage returns a function that reads the CPU time the sandbox has
// used so far, from the host's cgroup (v1) of the container.
func (sb *sandbox) cpuUsage(b *testing.B) func() time.Duration {
	b.Helper()
	out, err := exec.Command("docker", "inspect", "--format", "{{.Id}}", sb.name).Output()
	if err != nil {
		b.Fatalf("docker inspect %s: %v", sb.name, err)
	}
	file := "/sys/fs/cgroup/cpuacct/docker/" + strings.TrimSpace(string(out)) + "/cpuacct.usage"
	if _, err := os.ReadFile(file); err != nil {
		b.Skipf("no cgroup v1 CPU accounting for the sandbox: %v", err)
	}
	return func() time.Duration {
		data, err := os.ReadFile(file)
		if err != nil {
			b.Fatalf("read sandbox CPU usage: %v", err)
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
		if err != nil {
			b.Fatalf("parse sandbox CPU usage: %v", err)
		}
		return time.Duration(n)
	}
}
