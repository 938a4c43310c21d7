package agentd

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// leftovers prints the entries of /workspace (those of the outputs
// directory every run finds, rather than the directory itself) and /tmp, and
// the processes of the user other than itself.
const leftovers = `import os
me = os.getpid()
procs = 0
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) != me:
        try:
            if "Uid:\t65534" in open(f"/proc/{p}/status").read():
                procs += 1
        except OSError:
            pass
ws = [e for e in os.listdir("/workspace") if e != "outputs"] + os.listdir("/workspace/outputs")
print(len(ws), len(os.listdir("/tmp")), procs)`

// TestAbuse runs hostile programs. Each must end with a clear result (or,
// if it took the whole sandbox down, a clear error), and the next run on the
// same agent must work.
func TestAbuse(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) {
		c.MinActive = 2
		c.MaxSandboxes = 3
		c.Memory = 256 << 20
	})
	tests := []struct {
		name    string
		exec    *executionv1.Execution
		check   func(t *testing.T, r *executionv1.Result)
		timeout time.Duration
	}{
		{
			name: "fork bomb",
			exec: &executionv1.Execution{Language: "bash", Code: `:(){ :|:& };:`, Timeout: durationpb.New(5 * time.Second)},
			check: func(t *testing.T, r *executionv1.Result) {
				// The shell returns at once; the bomb goes on in the
				// background until forks fail or the runner kills what the
				// run left behind. The next run checks that nothing is left.
				if r.GetDuration().AsDuration() > 6*time.Second {
					t.Errorf("fork bomb ran past its timeout: %v", r)
				}
			},
		},
		{
			name: "python fork bomb",
			exec: &executionv1.Execution{Language: "python", Code: "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", Timeout: durationpb.New(5 * time.Second)},
			check: func(t *testing.T, r *executionv1.Result) {
				if r.GetExitCode() == 0 && !r.GetTimedOut() && !r.GetOomKilled() {
					t.Errorf("fork bomb ended well: %v", r)
				}
			},
		},
		{
			name: "memory bomb",
			exec: &executionv1.Execution{Language: "python", Code: "x = []\nwhile True:\n    x.append(bytearray(16 << 20))", Timeout: durationpb.New(20 * time.Second)},
			check: func(t *testing.T, r *executionv1.Result) {
				if !r.GetOomKilled() || r.GetExitCode() == 0 {
					t.Errorf("memory bomb: %v, want oom_killed", r)
				}
			},
		},
		{
			name: "memory bomb under a request's lower limit",
			exec: &executionv1.Execution{Language: "python", Code: "x = []\nwhile True:\n    x.append(bytearray(8 << 20))",
				Limits: &executionv1.Limits{MemoryBytes: 96 << 20}, Timeout: durationpb.New(20 * time.Second)},
			check: func(t *testing.T, r *executionv1.Result) {
				if !r.GetOomKilled() {
					t.Errorf("memory bomb: %v, want oom_killed", r)
				}
			},
		},
		{
			name: "disk fill",
			exec: &executionv1.Execution{Language: "bash", Code: `dd if=/dev/zero of=/workspace/fill bs=1M count=200 2>&1 | tail -1; dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>&1 | tail -1; df -m /workspace /tmp | tail -2`},
			check: func(t *testing.T, r *executionv1.Result) {
				if strings.Count(r.GetStdout(), "100% /") != 2 || !strings.Contains(r.GetStdout(), "(67 MB, 64 MiB) copied") {
					t.Errorf("disk fill: %v, want two full file systems", r)
				}
			},
		},
		{
			name: "stdout flood",
			exec: &executionv1.Execution{Language: "python", Code: "import sys\nb = b'x' * 65536\nfor _ in range(1700):\n    sys.stdout.buffer.write(b)\nprint('done', file=sys.stderr)", Timeout: durationpb.New(60 * time.Second)},
			check: func(t *testing.T, r *executionv1.Result) {
				if !r.GetTruncated() || len(r.GetStdout()) > 1<<20 || len(r.GetStdout()) < 1<<19 {
					t.Errorf("flood: truncated %v, %d bytes of stdout, exit %d", r.GetTruncated(), len(r.GetStdout()), r.GetExitCode())
				}
			},
		},
		{
			name: "sleep past timeout",
			exec: &executionv1.Execution{Language: "bash", Code: "sleep 3600", Timeout: durationpb.New(2 * time.Second)},
			check: func(t *testing.T, r *executionv1.Result) {
				if !r.GetTimedOut() || r.GetDuration().AsDuration() > 4*time.Second {
					t.Errorf("sleep: %v, want timed out after about 2 s", r)
				}
			},
		},
		{
			name: "write to read-only root",
			exec: &executionv1.Execution{Language: "bash", Code: `for f in /etc/passwd /usr/bin/python3 /opt/codemode/runner /newfile; do if echo x >> $f; then echo "wrote $f"; fi; done 2>/dev/null; echo end`},
			check: func(t *testing.T, r *executionv1.Result) {
				if r.GetStdout() != "end\n" {
					t.Errorf("wrote outside the workspace: %v", r)
				}
			},
		},
		{
			name: "signal, trace and read the runner",
			exec: &executionv1.Execution{Language: "python", Code: `
import os, signal, ctypes
for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
    try:
        os.kill(1, sig); print("signalled", sig)
    except OSError as e:
        print("kill", e.errno)
try:
    os.killpg(1, signal.SIGKILL); print("signalled group")
except OSError as e:
    print("killpg", e.errno)
for path in ("/proc/1/mem", "/proc/1/environ", "/proc/1/maps"):
    try:
        open(path, "rb").read(16); print("read", path)
    except OSError as e:
        print("open", e.errno)
libc = ctypes.CDLL(None, use_errno=True)
print("ptrace", libc.ptrace(16, 1, 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
`},
			check: func(t *testing.T, r *executionv1.Result) {
				if strings.Contains(r.GetStdout(), "signalled") || strings.Contains(r.GetStdout(), "read /") || !strings.Contains(r.GetStdout(), "ptrace -1") {
					t.Errorf("user code reached the runner:\n%s%s", r.GetStdout(), r.GetStderr())
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t0 := time.Now()
			res, err := a.client("connect").Execute(t.Context(), connect.NewRequest(&agentv1.ExecuteRequest{Execution: tt.exec}))
			took := time.Since(t0)
			if err != nil {
				// The sandbox went down as a whole: that must be said clearly.
				if connect.CodeOf(err) != connect.CodeUnavailable {
					t.Errorf("error %v, want a result or unavailable", err)
				}
				t.Logf("%s: %v after %v", tt.name, err, took.Round(time.Millisecond))
			} else {
				r := res.Msg.GetResult()
				t.Logf("%s: exit %d timed_out %v oom_killed %v truncated %v after %v; stderr %.200q", tt.name,
					r.GetExitCode(), r.GetTimedOut(), r.GetOomKilled(), r.GetTruncated(), took.Round(time.Millisecond), r.GetStderr())
				tt.check(t, r)
			}
			next := a.exec(t, &executionv1.Execution{Language: "python", Code: leftovers})
			if next.GetStdout() != "0 0 0\n" {
				t.Errorf("next run: %v", next)
			}
		})
	}
}
