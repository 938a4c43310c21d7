package agentd

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/agent/internal/sandbox"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// TestSandboxesRunUnderRunsc inspects every container of the agent.
func TestSandboxesRunUnderRunsc(t *testing.T) {
	t.Parallel()
	a := shared(t)
	a.waitWarm(t, 1)
	ctx := t.Context()
	list, err := a.Driver().Client().ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", sandbox.LabelAgent+"="+a.cfg.Name))})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) == 0 {
		t.Fatal("the agent has no containers")
	}
	for _, c := range list {
		info, err := a.Driver().Client().ContainerInspect(ctx, c.ID)
		if err != nil {
			continue // removed meanwhile
		}
		hc := info.HostConfig
		if hc.Runtime != "runsc" || hc.NetworkMode != "none" || !hc.ReadonlyRootfs ||
			!slices.Contains(hc.SecurityOpt, "no-new-privileges") || !slices.Equal([]string(hc.CapDrop), []string{"ALL"}) ||
			hc.Memory == 0 || hc.NanoCPUs == 0 || hc.PidsLimit == nil || *hc.PidsLimit == 0 ||
			!strings.Contains(hc.Tmpfs["/workspace"], "size=") || !strings.Contains(hc.Tmpfs["/tmp"], "size=") ||
			info.Config.Labels[sandbox.LabelSandbox] != "1" {
			t.Errorf("container %s is not hardened: %+v, labels %v", c.ID[:12], hc, info.Config.Labels)
		}
	}
}

// TestOnlyLoopback lists the sandbox's interfaces from inside, and shows
// that a listener the test opened on the host's loopback cannot be reached.
func TestOnlyLoopback(t *testing.T) {
	t.Parallel()
	a := shared(t)
	res := a.exec(t, &executionv1.Execution{Language: "bash", Code: `tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`})
	if res.GetExitCode() != 0 || res.GetStdout() != "lo\n" {
		t.Errorf("interfaces: %q (stderr %q), want only lo", res.GetStdout(), res.GetStderr())
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	res = a.exec(t, &executionv1.Execution{Language: "python", Code: fmt.Sprintf(`
import socket
try:
    socket.create_connection(("127.0.0.1", %d), timeout=2).close()
    print("connected")
except OSError as e:
    print("refused", type(e).__name__)
`, port)})
	if !strings.HasPrefix(res.GetStdout(), "refused") || accepted.Load() != 0 {
		t.Errorf("host loopback listener reached from the sandbox: %q, %d connections", res.GetStdout(), accepted.Load())
	}
}

// TestTimeout kills programs at their timeout, also while they write
// output, and the agent keeps serving.
func TestTimeout(t *testing.T) {
	t.Parallel()
	a := shared(t)
	for _, tt := range []struct{ name, lang, code string }{
		{"busy loop", "python", "while True: pass"},
		{"sleep", "bash", "sleep 3600"},
		{"output while looping", "python", "while True: print('x' * 100)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a.waitWarm(t, 1)
			t0 := time.Now()
			res := a.exec(t, &executionv1.Execution{Language: tt.lang, Code: tt.code, Timeout: durationpb.New(2 * time.Second)})
			took := time.Since(t0)
			if !res.GetTimedOut() || res.GetExitCode() == 0 {
				t.Errorf("result %v, want timed out", res)
			}
			// The run's own duration, as the runner measured it: the
			// call's may include waiting for a sandbox, which the tests
			// running beside this one on the shared agent can take.
			if d := res.GetDuration().AsDuration(); d > 4*time.Second {
				t.Errorf("run took %v for a 2 s timeout", d)
			}
			if took > 30*time.Second {
				t.Errorf("call took %v for a 2 s timeout", took)
			}
			t.Logf("timed out after %v (run %v)", took.Round(time.Millisecond), res.GetDuration().AsDuration())
			if res := a.exec(t, &executionv1.Execution{Language: "python", Code: "print(1)"}); res.GetStdout() != "1\n" {
				t.Errorf("next run: %v", res)
			}
		})
	}
}

// TestPythonRunsUnderPython runs code whose first line only Python parses.
func TestPythonRunsUnderPython(t *testing.T) {
	t.Parallel()
	a := shared(t)
	res := a.exec(t, &executionv1.Execution{Language: "python", Code: "def f(): return 42\nimport sys\nprint(f(), sys.argv[0])"})
	if res.GetExitCode() != 0 || !strings.HasPrefix(res.GetStdout(), "42 ") {
		t.Errorf("result %v", res)
	}
	res = a.exec(t, &executionv1.Execution{Language: "javascript", Code: "const x = 6 * 7; console.log(x)"})
	if res.GetExitCode() != 0 || res.GetStdout() != "42\n" {
		t.Errorf("javascript: %v", res)
	}
	res = a.exec(t, &executionv1.Execution{Language: "sh", Code: "echo $((6*7))"})
	if res.GetExitCode() != 0 || res.GetStdout() != "42\n" {
		t.Errorf("sh: %v", res)
	}
}

// TestUTF8Output checks that the API's strings are valid UTF-8 whatever the
// program writes.
func TestUTF8Output(t *testing.T) {
	t.Parallel()
	a := shared(t)
	res := a.exec(t, &executionv1.Execution{Language: "python", Code: `import sys
sys.stdout.buffer.write("café €😀".encode() + b"\xff\n")`})
	if res.GetStdout() != "café €😀\uFFFD\n" {
		t.Errorf("stdout %q", res.GetStdout())
	}
}

// TestInputs passes stdin and files.
func TestInputs(t *testing.T) {
	t.Parallel()
	a := shared(t)
	res := a.exec(t, &executionv1.Execution{
		Language: "python",
		Code:     "import sys\nprint(sys.stdin.read().upper(), open('data/in.txt').read())",
		Stdin:    []byte("hello"),
		Files:    []*executionv1.File{{Path: "data/in.txt", Content: []byte("file")}},
	})
	if res.GetStdout() != "HELLO file\n" {
		t.Errorf("result %v", res)
	}
}
