package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	"github.com/codemode-go/codemode/internal/testkit"
)

// outsideLinks is what user code plants in the workspace for
// TestSandboxFilesConfined: links out of it at every depth, absolute and
// relative, through other links, dangling, and into root's own writable
// directory (the modules lent to every later run).
const outsideLinks = `
ln -s /etc d
mkdir -p a deep/er sub && ln -s /proc/1 a/b && ln -s / deep/er/c
ln -s ../.. up
ln -s ../../../etc sub/rel
ln -s d/../etc via
ln -s /tmp t
ln -s /tmp/made-by-the-api dangling
ln -s ` + wire.UserLib + ` lib
echo mine > private.txt && chmod 000 private.txt
echo mine > ro.txt && chmod 444 ro.txt
mkdir rodir && chmod 555 rodir
`

// outsideState prints what TestSandboxFilesConfined checks is unchanged
// outside the workspace, as the user sees it.
const outsideState = `ls -A /tmp /dev/shm; ls -la ` + wire.UserLib + ` | grep -v ' \.\.\?$'; sha256sum ` + wire.UserLib + `/*.py; ls /etc/x 2>&1 || true`

// TestSandboxFilesConfined checks, in a real gVisor sandbox, that the file
// requests of a session follow no symbolic link out of the workspace,
// wherever the link is in the path, also while user code swaps directories
// for links during the requests, and that they do only what the user could.
func TestSandboxFilesConfined(t *testing.T) {
	t.Parallel()
	sb := startSandbox(t)
	ctx := t.Context()
	session := func(t *testing.T, code string) result {
		t.Helper()
		r := sb.run(ctx, &runnerv1.Run{Language: "bash", Code: code, Stateful: true})
		if r.err != nil || r.exit.GetCode() != 0 {
			t.Fatalf("%q: %v %q %q %v", code, r.exit, r.stdout, r.stderr, r.err)
		}
		return r
	}
	session(t, outsideLinks)
	before := session(t, outsideState).stdout

	// What must never come back: a line of root's /etc/shadow, of the
	// runner's environment, of /etc/hostname, of the lent modules.
	leaked := func(b []byte) bool {
		s := string(b)
		return strings.Contains(s, "root:") || strings.Contains(s, "PATH=") || strings.Contains(s, "HOSTNAME=") ||
			strings.Contains(s, "matplotlib")
	}
	t.Run("read", func(t *testing.T) {
		for _, p := range []string{
			"d/shadow", "d/hostname", "a/b/environ", "a/b/status", "deep/er/c/etc/shadow", "deep/er/c/proc/1/environ",
			"up/etc/shadow", "sub/rel/shadow", "via/shadow", "lib/codemode_mpl.py", "d/../../etc/shadow",
		} {
			f, err := sb.c.ReadFile(ctx, p, 0)
			if err == nil || leaked(f.GetContent()) {
				t.Errorf("ReadFile(%q) = %.60q, %v; want refused", p, f.GetContent(), err)
			} else if !errors.Is(err, wire.ErrFailedPrecondition) && !errors.Is(err, wire.ErrInvalidArgument) {
				t.Errorf("ReadFile(%q): %v, want failed_precondition", p, err)
			}
		}
		// The user's own file that the user may not read.
		if f, err := sb.c.ReadFile(ctx, "private.txt", 0); !errors.Is(err, wire.ErrFailedPrecondition) {
			t.Errorf("ReadFile(private.txt, mode 000) = %q, %v; want failed_precondition", f.GetContent(), err)
		}
	})
	t.Run("list", func(t *testing.T) {
		for _, p := range []string{"d", "a/b", "deep/er/c", "deep/er/c/etc", "up", "sub/rel", "via", "t", "lib"} {
			l, err := sb.c.ListFiles(ctx, p)
			if err == nil {
				t.Errorf("ListFiles(%q) listed %d entries (%v); want refused", p, len(l), l[:min(3, len(l))])
			} else if !errors.Is(err, wire.ErrFailedPrecondition) {
				t.Errorf("ListFiles(%q): %v, want failed_precondition", p, err)
			}
		}
	})
	t.Run("write", func(t *testing.T) {
		for _, p := range []string{
			"d/x", "a/b/x", "deep/er/c/tmp/x", "deep/er/c/etc/x", "up/tmp/x", "sub/rel/x", "via/x", "t/x", "t/new/x",
			"dangling", "lib/x", "lib/codemode_mpl.py", "ro.txt", "rodir/x", "rodir/new/x",
		} {
			err := sb.c.WriteFile(ctx, &runnerv1.File{Path: p, Content: []byte("pwned\n")})
			if !errors.Is(err, wire.ErrFailedPrecondition) {
				t.Errorf("WriteFile(%q): %v, want failed_precondition", p, err)
			}
		}
		if after := session(t, outsideState).stdout; after != before {
			t.Errorf("outside the workspace, before the writes:\n%s\nafter:\n%s", before, after)
		}
		if r := session(t, "cat ro.txt; ls -A rodir"); r.stdout != "mine\n" {
			t.Errorf("files the user may not write: %q", r.stdout)
		}
	})
	t.Run("still works inside", func(t *testing.T) {
		filesStillWorkInside(t, ctx, sb, session)
	})
	t.Run("race", func(t *testing.T) {
		testFilesRace(t, sb, session)
		if after := session(t, outsideState).stdout; after != before {
			t.Errorf("outside the workspace, before the race:\n%s\nafter:\n%s", before, after)
		}
	})
}

// filesStillWorkInside is TestSandboxFilesConfined's "still works inside".
func filesStillWorkInside(t *testing.T, ctx context.Context, sb *sandbox, session func(*testing.T, string) result) {
	// Links that stay inside are still followed, and what the runner
	// makes is the user's.
	session(t, "mkdir -p real && echo in > real/f && ln -s real inlink && ln -s ../real/f sub/flink && ln -s real/made dl")
	for _, p := range []string{"inlink/new/g", "dl"} {
		if err := sb.c.WriteFile(ctx, &runnerv1.File{Path: p, Content: []byte("g"), Mode: 0o640}); err != nil {
			t.Fatal(err)
		}
	}
	for p, want := range map[string]string{"inlink/f": "in\n", "sub/flink": "in\n", "real/new/g": "g", "real/made": "g"} {
		if f, err := sb.c.ReadFile(ctx, p, 0); err != nil || string(f.GetContent()) != want {
			t.Errorf("ReadFile(%q) = %q, %v; want %q", p, f.GetContent(), err, want)
		}
	}
	if l, err := sb.c.ListFiles(ctx, "inlink"); err != nil || len(l) != 3 {
		t.Errorf("ListFiles(inlink) = %v, %v", l, err)
	}
	if r := session(t, "stat -c '%U:%G %a' real/new real/new/g"); r.stdout != "nobody:nogroup 755\nnobody:nogroup 640\n" {
		t.Errorf("owners and modes: %q", r.stdout)
	}
}

// flipper is a user process that, until race/stop exists (and for 60 s at
// most), makes race/cur a directory of the workspace (with etc/shadow and
// tmp/ in it), then nothing, then a link to /, then nothing, in a loop.
const flipper = `
import os, shutil, time
os.makedirs('race/dir/etc'); os.makedirs('race/dir/tmp')
open('race/dir/etc/shadow', 'w').write('inside\n')
os.symlink('/', 'race/link')
n, errors, end = 0, 0, time.time() + 60
try:
    while time.time() < end and not os.path.exists('race/stop'):
        for src in ('race/dir', 'race/link'):
            try:
                os.rename(src, 'race/cur')
                os.rename('race/cur', src)
            except OSError:
                # A write request made race/cur a directory meanwhile.
                errors += 1
                shutil.rmtree('race/cur', ignore_errors=True)
        n += 1
finally:
    open('race/flips', 'w').write('%d %d' % (n, errors))
`

// prober is a user process that, until race/stop exists (and for 60 s at
// most), tries to signal (signal 0: the permission check only) and to trace
// every thread of the runner, and to open its environment, memory and
// standard input through /proc, and writes how often either was allowed.
const prober = `
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
SYS_tgkill, PTRACE_SEIZE, PTRACE_DETACH, ESRCH = 234, 0x4206, 17, 3
sig = trace = rounds = seen = 0
end = time.time() + 60
while time.time() < end and not os.path.exists('race/stop'):
    for tid in range(2, 400):
        if libc.syscall(SYS_tgkill, 1, tid, 0) == 0:
            sig += 1
        elif ctypes.get_errno() == ESRCH:
            continue  # not a thread of the runner
        seen += 1
        if libc.ptrace(PTRACE_SEIZE, tid, 0, 0) == 0:
            trace += 1
            libc.ptrace(PTRACE_DETACH, tid, 0, 0)
        for f in ('environ', 'mem', 'fd/0'):
            try:
                os.close(os.open('/proc/1/task/%d/%s' % (tid, f), os.O_RDONLY | os.O_NONBLOCK))
                trace += 1
            except OSError:
                pass
    rounds += 1
open('race/probes', 'w').write('%d %d %d %d' % (sig, trace, rounds, seen))
`

func testFilesRace(t *testing.T, sb *sandbox, session func(*testing.T, string) result) {
	ctx := t.Context()
	session(t, "mkdir race && (python3 -c "+shellQuote(flipper)+" > race/flipper.log 2>&1 &) && (python3 -c "+shellQuote(prober)+" > race/prober.log 2>&1 &) && while [ ! -e race/link ]; do sleep 0.01; done")
	var bad []string
	var ok [3]int
	const rounds = 150
	for i := range rounds {
		f, err := sb.c.ReadFile(ctx, "race/cur/etc/shadow", 0)
		if err == nil {
			ok[0]++
			if string(f.GetContent()) != "inside\n" {
				bad = append(bad, fmt.Sprintf("read %.60q", f.GetContent()))
			}
		}
		l, err := sb.c.ListFiles(ctx, "race/cur/etc")
		if err == nil {
			ok[1]++
			for _, fi := range l {
				if fi.GetPath() != "race/cur/etc/shadow" {
					bad = append(bad, "listed "+fi.GetPath())
					break
				}
			}
		}
		p := fmt.Sprintf("race/cur/tmp/x%d", i)
		if err := sb.c.WriteFile(ctx, &runnerv1.File{Path: p, Content: []byte("x")}); err == nil {
			ok[2]++
		}
	}
	r := session(t, "touch race/stop; for i in $(seq 200); do [ -e race/flips ] && [ -e race/probes ] && break; sleep 0.05; done; cat race/flips; echo; cat race/probes; echo; cat race/*.log; ls /tmp | grep -c '^x' || true")
	t.Logf("%d rounds: %d reads, %d lists, %d writes succeeded (inside); flips (and errors), probes (signals allowed, traces and /proc opens allowed, rounds, runner threads probed), writes to /tmp:\n%s", rounds, ok[0], ok[1], ok[2], r.stdout)
	lines := strings.Split(r.stdout, "\n")
	var sig, trace, probeRounds, seen int
	if len(lines) < 3 {
		t.Fatalf("no probes: %q", r.stdout)
	}
	if _, err := fmt.Sscan(lines[1], &sig, &trace, &probeRounds, &seen); err != nil || seen == 0 {
		t.Errorf("the prober saw no thread of the runner (%v): %q", err, r.stdout)
	}
	if sig != 0 || trace != 0 {
		t.Errorf("the user's processes could signal or trace a thread of the runner: %q", r.stdout)
	}
	if !strings.HasSuffix(r.stdout, "\n0\n") {
		t.Errorf("the file requests wrote to /tmp: %q", r.stdout)
	}
	if len(bad) > 0 {
		t.Errorf("the file requests went out of the workspace %d times: %v", len(bad), bad[:min(5, len(bad))])
	}
}

// BenchmarkSandboxFiles measures ReadFile, WriteFile and ListFiles through
// the runner in a gVisor sandbox, as a session sees them. With
// RUNNER_BENCH_BASELINE set to another runner binary (an older build), it
// measures that one too, in the same run, in a sandbox of its own:
//
//	go test -run '^$' -bench SandboxFiles -benchtime 300x ./agent/internal/runner
func BenchmarkSandboxFiles(b *testing.B) {
	type target struct {
		name string
		sb   *sandbox
	}
	targets := []target{{"runner", startSandbox(b)}}
	if base := os.Getenv("RUNNER_BENCH_BASELINE"); base != "" {
		targets = append(targets, target{"baseline", startSandboxWith(b, base)})
	}
	ctx := b.Context()
	content := make([]byte, 4096)
	for _, tg := range targets {
		if _, err := tg.sb.c.Run(ctx, &runnerv1.Run{Language: "bash", Code: "mkdir -p dir && for i in $(seq 20); do echo $i > dir/f$i; done", Stateful: true}, nil); err != nil {
			b.Fatal(err)
		}
		if err := tg.sb.c.WriteFile(ctx, &runnerv1.File{Path: "dir/data", Content: content}); err != nil {
			b.Fatal(err)
		}
	}
	ops := []struct {
		name string
		f    func(c *wire.Client) error
	}{
		{"read-4k", func(c *wire.Client) error { _, err := c.ReadFile(ctx, "dir/data", 0); return err }},
		{"write-4k", func(c *wire.Client) error {
			return c.WriteFile(ctx, &runnerv1.File{Path: "dir/data", Content: content})
		}},
		{"write-4k-2-deep", func(c *wire.Client) error {
			return c.WriteFile(ctx, &runnerv1.File{Path: "new/sub/data", Content: content})
		}},
		{"list-21", func(c *wire.Client) error { _, err := c.ListFiles(ctx, "dir"); return err }},
		// A run makes the outputs directory as the user before it starts.
		{"run-bash-true", func(c *wire.Client) error {
			exit, err := c.Run(ctx, &runnerv1.Run{Language: "bash", Code: "true", Stateful: true}, nil)
			if err == nil && exit.GetCode() != 0 {
				err = fmt.Errorf("exit %v", exit)
			}
			return err
		}},
	}
	// Each operation on each runner in turn, so that a change of the
	// host's load weighs on both alike.
	for _, op := range ops {
		for _, tg := range targets {
			b.Run(op.name+"/"+tg.name, func(b *testing.B) {
				var lat []time.Duration
				for b.Loop() {
					start := time.Now()
					if err := op.f(tg.sb.c); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(start))
				}
				testkit.ReportPercentiles(b, lat, time.Millisecond)
			})
		}
	}
}

// startSandboxWith starts a sandbox with the given runner binary ("": the
// one built from this tree).
func startSandboxWith(t testing.TB, bin string) *sandbox {
	if bin == "" {
		return startSandbox(t)
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath(abs); err != nil {
		t.Fatalf("baseline runner: %v", err)
	}
	return startSandboxBin(t, abs)
}

// TestSandboxArtifactsConfined checks, in a real gVisor sandbox, that the
// walk that collects a run's artifacts follows no link out of the
// workspace: neither outputs itself nor a directory in it made a link to
// the runner's /proc directory or to /etc by the run.
func TestSandboxArtifactsConfined(t *testing.T) {
	t.Parallel()
	sb := startSandbox(t)
	for _, code := range []string{
		"rm -rf outputs && ln -s /proc/1 outputs",
		"rm -rf outputs && ln -s /etc outputs",
		"rm -rf outputs && mkdir outputs && ln -s /proc/1 outputs/p && ln -s /etc outputs/e && echo ok > outputs/real.txt",
	} {
		for _, stateful := range []bool{false, true} {
			r := sb.run(t.Context(), &runnerv1.Run{Language: "bash", Code: code, Stateful: stateful})
			if r.err != nil || r.exit.GetCode() != 0 {
				t.Fatalf("%q: %v %q %v", code, r.exit, r.stderr, r.err)
			}
			names := artifactNames(r.exit)
			if len(names) > 1 || len(names) == 1 && names[0] != "real.txt text/plain; charset=utf-8" {
				t.Errorf("%q (stateful %v): artifacts %.300q", code, stateful, names)
			}
		}
	}
}
