package runner

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	"github.com/codemode-go/codemode/internal/testkit"
)

// startPreloaded starts a sandbox whose runner forks Python runs from a
// preloaded parent with the default modules.
func startPreloaded(t *testing.T, flags ...string) *sandbox {
	t.Helper()
	return startSandboxOpts(t, buildRunner(t), "1g", append([]string{"-preload=default"}, flags...)...)
}

// reset scrubs sb as between two unrelated stateless runs.
func (sb *sandbox) reset(t *testing.T) {
	t.Helper()
	if err := sb.c.Reset(t.Context()); err != nil {
		t.Fatalf("reset: %v\n%s", err, sb.log.String())
	}
}

// A stateless run that names a preloaded module runs forked from the
// parent, or from the light parent if it imports nothing but the light
// parent's modules (requests, numpy) and the standard library, whether its interpreter was prestarted that way or
// not; other code takes the interpreter prestarted, and the next prestart
// is of the kind the last run wanted.
func TestPreloadChoosesInterpreter(t *testing.T) {
	t.Parallel()
	sb := startPreloaded(t)
	ppid := func(code string) string {
		t.Helper()
		r := sb.mustRun(t, "python", code)
		sb.reset(t)
		if r.exit.GetCode() != 0 {
			t.Fatalf("run %q: %v %q %q", code, r.exit, r.stdout, r.stderr)
		}
		return strings.TrimSpace(r.stdout)
	}
	// "panda" is no word of "pandas": the code names numpy alone.
	light := ppid("import os, sys, numpy; print(os.getppid(), any(m.startswith('panda') for m in sys.modules))")
	parent := ppid("import os, sys, numpy, pandas; print(os.getppid())")
	if light == "1 False" || parent == "1" || !strings.HasSuffix(light, " False") {
		t.Fatalf("runs naming numpy, and numpy and pandas: parents %q and %q, want the light parent (without pandas) and the parent", light, parent)
	}
	light, _, _ = strings.Cut(light, " ")
	if light == parent {
		t.Fatalf("both runs forked from %s", parent)
	}
	for i, tc := range []struct{ code, want string }{
		{"import os; print(os.getppid())", parent},                                              // prestarted forked
		{"import os; print(os.getppid())", "1"},                                                 // prestarted fresh
		{"import os, numpy, json; print(os.getppid())", light},                                  // forked now
		{"import os, numpy, json; print(os.getppid())", light},                                  // prestarted light
		{"import os, numpy\nif 0: import seaborn\nprint(os.getppid())", parent},                 // forked now: imports beyond the light parent's
		{"import os, numpy, json; print(os.getppid())", parent},                                 // prestarted forked: holds numpy too
		{"import os, numpy; print(os.getppid())", light},                                        // prestarted light
		{"import os, sys; print(os.getppid() if 'pandas' in sys.modules else 'fresh')", parent}, // forked now: the light one lacks pandas
		{"import os, numpy; print(os.getppid())", parent},                                       // prestarted forked
		{"import os, numpy, scipy; print(os.getppid())", parent},                                // forked now
		{"import os, requests; print(os.getppid())", parent},                                    // prestarted forked: holds requests too
		{"import os, requests, json; print(os.getppid())", light},                               // prestarted light: holds requests
	} {
		if got := ppid(tc.code); got != tc.want {
			t.Errorf("run %d %q: parent %s, want %s", i, tc.code, got, tc.want)
		}
	}
}

// allocatorProbe fills and empties pymalloc's arenas, then prints the file
// of the function its arenas come from (pyarena.so: glibc's heap, the
// languages table's ParentEnv; python3: their own mappings) and which of
// the parent's own settings its environment shows.
const allocatorProbe = `import ctypes, os
for _ in range(3):
    x = [str(i) for i in range(300000)]
    del x
class Arenas(ctypes.Structure):
    _fields_ = [("ctx", ctypes.c_void_p), ("alloc", ctypes.c_void_p), ("free", ctypes.c_void_p)]
class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]
a, info = Arenas(), DlInfo()
ctypes.pythonapi.PyObject_GetArenaAllocator(ctypes.byref(a))
ctypes.CDLL(None).dladdr(ctypes.c_void_p(a.alloc), ctypes.byref(info))
print(os.path.basename(info.fname.decode()), sorted(k for k in os.environ if k.startswith(("PYTHONMALLOC", "MALLOC_", "LD_"))))
`

// Interpreters forked from either parent, and a session's kernel, take
// pymalloc's arenas from glibc's heap as the parent does (ParentEnv's
// pyarena.so), and free them there, without seeing the settings that made
// it so; a fresh interpreter, and one a run starts, map their arenas.
func TestPreloadAllocator(t *testing.T) {
	t.Parallel()
	sb := startPreloaded(t)
	const forked, fresh = "pyarena.so []\n", "python3 []\n"
	for _, tc := range []struct{ name, code, want string }{
		{"light parent", "import numpy\n" + allocatorProbe, forked},
		{"parent", "import pandas\n" + allocatorProbe, forked},
		{"light parent again", "import numpy\n" + allocatorProbe, forked},
		{"parent again", "import pandas\n" + allocatorProbe, forked},
		{"started by a run", "import subprocess, sys\nsys.stdout.flush()\nsubprocess.run([sys.executable, '-c', " + strconv.Quote(allocatorProbe) + "])", fresh},
	} {
		if r := sb.mustRun(t, "python", tc.code); r.stdout != tc.want {
			t.Errorf("%s: stdout %q, want %q; stderr %q", tc.name, r.stdout, tc.want, r.stderr)
		}
		sb.reset(t)
	}
	if r := sb.run(t.Context(), &runnerv1.Run{Language: "python", Code: allocatorProbe, Stateful: true}); r.err != nil || r.stdout != forked {
		t.Errorf("session: stdout %q, want %q; stderr %q, %v", r.stdout, forked, r.stderr, r.err)
	}
	sb.reset(t)
	cold := startSandboxOpts(t, buildRunner(t), "256m")
	if r := cold.mustRun(t, "python", "import numpy\n"+allocatorProbe); r.stdout != fresh {
		t.Errorf("without preloading: stdout %q, want %q; stderr %q", r.stdout, fresh, r.stderr)
	}
}

// With -preload-start=false a sandbox whose runs name no preloaded module
// never starts a parent; the first run that names one starts in a fresh
// interpreter, and the Reset after it starts the parent, which forks the
// next such run.
func TestPreloadStartsOnDemand(t *testing.T) {
	t.Parallel()
	sb := startPreloaded(t, "-preload-start=false")
	run := func(code string) string {
		t.Helper()
		r := sb.mustRun(t, "python", code)
		sb.reset(t)
		if r.exit.GetCode() != 0 {
			t.Fatalf("run %q: %v %q %q", code, r.exit, r.stdout, r.stderr)
		}
		return strings.TrimSpace(r.stdout)
	}
	for range 2 {
		// The parent's /proc files have the user's uid under gVisor.
		if got := run(countUserProcs); got != "0" {
			t.Fatalf("other processes of the user in a sandbox whose runs named no module: %s", got)
		}
	}
	if got := run("import os, numpy; print(os.getppid())"); got != "1" {
		t.Fatalf("first run naming numpy: parent %s, want a fresh interpreter (1)", got)
	}
	if got := run("import os, numpy; print(os.getppid())"); got == "1" {
		t.Fatalf("second run naming numpy ran in a fresh interpreter")
	}
	if got := run(countUserProcs); got != "2" {
		t.Fatalf("processes of the user beside a run that names no module, parent and light parent included: %s, want 2", got)
	}
}

// TestPreloadIsolation runs, in one sandbox whose Python runs are forked
// from a preloaded parent, run A then (after the scrub) run B, as two
// unrelated callers would: nothing A does to the modules the parent
// imported, to the interpreter or to the parent reaches B.
func TestPreloadIsolation(t *testing.T) {
	t.Parallel()
	sb := startPreloaded(t, "-parent-forks=1000")
	// B runs before A too, and must print the same then. Each pair runs
	// forked from the light parent where its code lets it (naming nothing
	// beyond the light parent's modules and the standard library), and
	// from the parent (naming pandas too; see languages.NamesModule and
	// ImportsOnly).
	ab := func(t *testing.T, a, b, want string) {
		t.Helper()
		for _, head := range []string{"import numpy\n", "import numpy, pandas\n"} {
			r := sb.mustRun(t, "python", head+b)
			sb.reset(t)
			if r.stdout != want || r.exit.GetCode() != 0 {
				t.Fatalf("%q: run B before A: code %d, stdout %q, stderr %q; want %q", head, r.exit.GetCode(), r.stdout, r.stderr, want)
			}
			if r := sb.mustRun(t, "python", head+a); r.exit.GetCode() != 0 {
				t.Fatalf("%q: run A: code %d, stdout %q, stderr %q", head, r.exit.GetCode(), r.stdout, r.stderr)
			}
			sb.reset(t)
			r = sb.mustRun(t, "python", head+b)
			if r.stdout != want || r.exit.GetCode() != 0 {
				t.Errorf("%q: run B: code %d, stdout %q, stderr %q; want %q", head, r.exit.GetCode(), r.stdout, r.stderr, want)
			}
			sb.reset(t)
		}
	}
	t.Run("monkeypatches", func(t *testing.T) {
		ab(t, `
import pandas, requests, numpy, json
pandas.DataFrame.sum = lambda *a, **k: "patched"
requests.get = None
numpy.random.seed(0)
json.leftover = 1
numpy.pi = 3`,
			`
import pandas, requests, numpy, json
print(pandas.DataFrame({"a": [1, 2]}).sum()["a"], callable(requests.get), hasattr(json, "leftover"), numpy.pi > 3.1)`,
			"3 True False True\n")
	})
	t.Run("monkeypatches of the light parent's modules", func(t *testing.T) {
		ab(t, `
import requests, numpy, json
requests.get = None
requests.Session.request = None
requests.adapters.DEFAULT_RETRIES = 7
numpy.random.seed(0)
json.leftover = 1`,
			`
import requests, numpy, json
print(callable(requests.get), callable(requests.Session.request), requests.adapters.DEFAULT_RETRIES, hasattr(json, "leftover"))`,
			"True True 0 False\n")
	})
	t.Run("interpreter state", func(t *testing.T) {
		ab(t, `
import sys, atexit, matplotlib, builtins, os
class Hook:
    def find_spec(self, *a): raise ImportError("hooked")
sys.meta_path.insert(0, Hook())
sys.path.insert(0, "/tmp/evil")
matplotlib.rcParams["lines.linewidth"] = 42
builtins.leftover = 1
os.environ["LEFTOVER"] = "1"
atexit.register(lambda: None)
sys.setrecursionlimit(77)`,
			`
import sys, atexit, matplotlib, builtins, os
print(len([h for h in sys.meta_path if type(h).__name__ == "Hook"]), "/tmp/evil" in sys.path, matplotlib.rcParams["lines.linewidth"], hasattr(builtins, "leftover"), "LEFTOVER" in os.environ, atexit._ncallbacks(), sys.getrecursionlimit())`,
			"0 False 1.5 False False 3 1000\n")
	})
	t.Run("threads and processes", func(t *testing.T) {
		ab(t, `
import threading, subprocess, time, os
threading.Thread(target=time.sleep, args=(1000,), daemon=True).start()
subprocess.Popen(["sleep", "1000"], start_new_session=True)
if os.fork() == 0:
    os.setsid(); time.sleep(1000)`,
			"import threading\nprint(threading.active_count())\n"+countUserProcsButParent,
			"1\n0\n")
	})
	t.Run("memory", func(t *testing.T) {
		ab(t, "import numpy\nkeep = [bytearray(64 << 20) for _ in range(3)]\nnumpy.leftover = keep",
			"import numpy\nprint(hasattr(numpy, 'leftover'))",
			"False\n")
	})
	t.Run("random numbers differ", func(t *testing.T) {
		randomNumbersDiffer(t, sb)
	})
	t.Run("parent out of reach", func(t *testing.T) {
		parentOutOfReach(t, sb)
	})
	t.Run("killed parent is replaced", func(t *testing.T) {
		killedParentReplaced(t, sb)
	})
}

// randomNumbersDiffer is TestPreloadIsolation's "random numbers differ".
func randomNumbersDiffer(t *testing.T, sb *sandbox) {
	draw := "import random, numpy\nprint(random.random(), numpy.random.rand(), numpy.random.default_rng().random())"
	a := sb.mustRun(t, "python", draw)
	sb.reset(t)
	b := sb.mustRun(t, "python", draw)
	sb.reset(t)
	if a.stdout == "" || a.stdout == b.stdout {
		t.Errorf("two runs drew %q and %q", a.stdout, b.stdout)
	}
	as, bs := strings.Fields(a.stdout), strings.Fields(b.stdout)
	for i := range min(len(as), len(bs)) {
		if as[i] == bs[i] {
			t.Errorf("generator %d gave %s in both runs", i, as[i])
		}
	}
}

// parentOutOfReach is TestPreloadIsolation's "parent out of reach": the
// light parent's (the run names numpy alone) and the parent's.
func parentOutOfReach(t *testing.T, sb *sandbox) {
	for _, mods := range []string{"numpy", "numpy, pandas"} {
		parentOutOfReachOf(t, sb, mods)
	}
}

func parentOutOfReachOf(t *testing.T, sb *sandbox, mods string) {
	r := sb.mustRun(t, "python", `
import os, signal, ctypes, `+mods+`
ppid = os.getppid()
out = []
for sig in (0, signal.SIGSTOP, signal.SIGKILL):
    try:
        os.kill(ppid, sig); out.append("kill %d allowed" % sig)
    except PermissionError:
        out.append("kill refused")
try:
    open("/proc/%d/mem" % ppid, "rb").read(1); out.append("mem read")
except OSError as e:
    out.append("mem refused")
try:
    open("/proc/%d/environ" % ppid, "rb").read(); out.append("environ read")
except OSError:
    out.append("environ refused")
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_ATTACH, PTRACE_SEIZE = 16, 0x4206
for req in (PTRACE_ATTACH, PTRACE_SEIZE):
    out.append("ptrace refused" if libc.ptrace(req, ppid, None, None) == -1 else "ptrace allowed")
st = open("/proc/%d/status" % ppid).read()
uids = [l for l in st.splitlines() if l.startswith("Uid:")][0].split()[1:]
out.append("parent uids " + " ".join(uids))
print(*out, sep="\n")`)
	want := "kill refused\nkill refused\nkill refused\nmem refused\nenviron refused\nptrace refused\nptrace refused\nparent uids 65533 65534 65533 65534\n"
	if r.stdout != want {
		t.Errorf("importing %s: got stdout %q stderr %q, want %q", mods, r.stdout, r.stderr, want)
	}
	sb.reset(t)
	if r := sb.mustRun(t, "python", "import sys; print('pandas' in sys.modules)"); r.stdout != "True\n" {
		t.Errorf("after the probe: stdout %q stderr %q", r.stdout, r.stderr)
	}
	sb.reset(t)
}

// killedParentReplaced is TestPreloadIsolation's "killed parent is
// replaced": a light parent killed leaves its runs to the parent; the
// parent killed (its light parent dies with it) is replaced with both.
func killedParentReplaced(t *testing.T, sb *sandbox) {
	ppid := func(code string) string {
		t.Helper()
		r := sb.mustRun(t, "python", code)
		sb.reset(t)
		return strings.TrimSpace(r.stdout)
	}
	// kill kills a parent and waits until it has exited (a zombie or
	// gone). kill(1) returns once the signal is sent; a run that came in
	// the moment after, while the parent still lived, would get the
	// interpreter forked from it and die with it (its children die with
	// their parent), a failed run, not one that shows whether the parent
	// is replaced.
	kill := func(pid string) {
		t.Helper()
		if out, err := exec.Command("docker", "exec", sb.name, "kill", "-9", pid).CombinedOutput(); err != nil {
			t.Fatalf("kill parent %s: %v: %s", pid, err, out)
		}
		wait := `for i in $(seq 500); do s=$(cat /proc/` + pid + `/stat 2>/dev/null) || exit 0; case "${s##*) }" in Z*|X*) exit 0;; esac; sleep 0.01; done; exit 1`
		if out, err := exec.Command("docker", "exec", sb.name, "sh", "-c", wait).CombinedOutput(); err != nil {
			t.Fatalf("parent %s still running 5 s after SIGKILL: %v: %s", pid, err, out)
		}
	}
	const lightCode, parentCode = "import os, numpy; print(os.getppid())", "import os, numpy, pandas; print(os.getppid())"
	// The first has the next prestarted interpreter forked from the light
	// parent.
	ppid(lightCode)
	light, parent := ppid(lightCode), ppid(parentCode)
	if light == parent {
		t.Fatalf("runs naming numpy alone, and pandas too, both forked from %s", light)
	}
	kill(light)
	if got := ppid(lightCode); got != parent {
		t.Errorf("run naming numpy after its light parent %s died: parent %q, want %s", light, got, parent)
	}
	kill(parent)
	// The prestarted interpreter died with it: this run starts one
	// fresh; the Reset after it starts a new parent.
	if r := sb.mustRun(t, "python", "print(1)"); r.stdout != "1\n" {
		t.Errorf("run after the parent died: stdout %q stderr %q", r.stdout, r.stderr)
	}
	sb.reset(t)
	newParent := ppid(parentCode)
	ppid(lightCode)
	newLight := ppid(lightCode)
	if newParent == parent || newLight == light || newLight == newParent || newParent == "1" || newLight == "1" {
		t.Errorf("after the parent died: parents %q and %q (old %s and %s)", newParent, newLight, parent, light)
	}
}

// TestPreloadParentReplaced shows that a parent forks at most
// -parent-forks interpreters.
func TestPreloadParentReplaced(t *testing.T) {
	t.Parallel()
	sb := startPreloaded(t, "-parent-forks=2")
	var ppids []string
	for range 3 {
		r := sb.mustRun(t, "python", "import os, sys; print(os.getppid(), 'numpy' in sys.modules)")
		ppids = append(ppids, r.stdout)
		sb.reset(t)
	}
	if ppids[0] != ppids[1] || ppids[1] == ppids[2] || !strings.HasSuffix(ppids[2], " True\n") {
		t.Errorf("parents of three runs with -parent-forks=2: %q", ppids)
	}
}

// countUserProcsButParent is countUserProcs less the preloaded parents,
// whose /proc files gVisor gives their effective uid, the user's (Linux
// would give them to root: they are not dumpable): it counts the processes
// whose real uid is the user's.
const countUserProcsButParent = `import os
def real_uid(pid):
    try:
        with open("/proc/%s/status" % pid) as f:
            return next(int(l.split()[1]) for l in f if l.startswith("Uid:"))
    except (OSError, StopIteration):
        return -1
print(sum(1 for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid() and real_uid(p) == os.getuid()))`

// A run forked from the preloaded parent is indistinguishable from one in
// an interpreter started for it (python3 -c), as a prestarted one is.
func TestPreloadedPythonIsLikeCold(t *testing.T) {
	t.Parallel()
	cold := startSandboxOpts(t, buildRunner(t), "256m", "-prestart=false")
	warm := startPreloaded(t)
	for _, tc := range pythonLikeColdCases {
		t.Run(tc.name, func(t *testing.T) {
			run := func(sb *sandbox) result {
				// Naming numpy has the run forked from the parent.
				r := &runnerv1.Run{Language: "python", Code: "# numpy\n" + tc.code, Stdin: []byte(tc.stdin), Timeout: durationpb.New(20 * time.Second)}
				for name, content := range tc.files {
					r.Files = append(r.Files, &runnerv1.File{Path: name, Content: []byte(content)})
				}
				res := sb.run(t.Context(), r)
				sb.reset(t)
				if res.err != nil {
					t.Fatal(res.err)
				}
				return res
			}
			want, got := run(cold), run(warm)
			if got.stdout != want.stdout || got.stderr != want.stderr || got.exit.GetCode() != want.exit.GetCode() {
				t.Errorf("preloaded: code %d, stdout %q, stderr %q\ncold:      code %d, stdout %q, stderr %q",
					got.exit.GetCode(), got.stdout, got.stderr, want.exit.GetCode(), want.stdout, want.stderr)
			}
		})
	}
}

// A session's kernel is forked from the preloaded parent too: its first
// cell finds the modules imported, and it keeps its state from cell to
// cell.
func TestPreloadSession(t *testing.T) {
	t.Parallel()
	sb := startPreloaded(t)
	cell := func(code string) result {
		t.Helper()
		r := sb.run(t.Context(), &runnerv1.Run{Language: "python", Code: code, Stateful: true})
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r
	}
	if r := cell("import sys, os\nx = 41\nprint('pandas' in sys.modules, os.getuid(), os.getcwd())"); r.stdout != "True 65534 /workspace\n" {
		t.Errorf("first cell: stdout %q stderr %q", r.stdout, r.stderr)
	}
	if r := cell("x + 1"); r.stdout != "42\n" {
		t.Errorf("second cell: stdout %q stderr %q", r.stdout, r.stderr)
	}
	sb.reset(t)
	if r := sb.mustRun(t, "python", "print('x' in globals())"); r.stdout != "False\n" {
		t.Errorf("stateless run after the session: stdout %q stderr %q", r.stdout, r.stderr)
	}
}

// What a run leaves unclosed is flushed when it ends (the forked
// interpreter skips the teardown of the parent's modules, not of the run's
// objects), and plt.show() saves through the runner's backend.
func TestPreloadEndOfRun(t *testing.T) {
	t.Parallel()
	sb := startPreloaded(t)
	r := sb.mustRun(t, "python", "f = open('outputs/left-open.txt', 'w')\nf.write('data')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()")
	got := map[string]string{}
	for _, a := range r.exit.GetArtifacts() {
		got[a.GetName()] = a.GetMediaType()
		if a.GetName() == "left-open.txt" && string(a.GetContent()) != "data" {
			t.Errorf("left-open.txt holds %q, want %q", a.GetContent(), "data")
		}
	}
	if _, ok := got["left-open.txt"]; !ok || got["figure-1.png"] != "image/png" {
		t.Errorf("artifacts %v, stderr %q", got, r.stderr)
	}
}

// endNameCode finds the name of the socket on which the run's interpreter
// reports its end (zygote.py's _report_end), as code that means harm would,
// and defines report(code), which sends a report as that interpreter does.
const endNameCode = `import os, socket, sys, time, numpy
f, name = sys._getframe(), None
while f is not None and name is None:
    v = f.f_locals.get("end")
    name = v if isinstance(v, str) else None
    f = f.f_back
def report(code):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect("\0" + name)
    s.send(bytes((code,)))
`

// A forked interpreter reports its own end, and the run ends on it, without
// waiting for gVisor to tear the process down; only the run's interpreter
// can report, and one that reports early only ends its own run, whose
// processes are gone before the next run.
func TestPreloadEndReport(t *testing.T) {
	t.Parallel()
	sb := startPreloaded(t, "-log-level=debug")
	// A run ends on its parent's word when that comes first (a runner
	// starved of CPU may read it late), so of three, one must have ended
	// on its report: forked from the light parent, and from the parent.
	for _, tc := range []struct{ mods, from string }{{"numpy", "light"}, {"numpy, pandas", "parent"}} {
		for range 3 {
			if r := sb.mustRun(t, "python", "import sys, "+tc.mods+"\nprint('a')\nsys.exit(3)"); r.exit.GetCode() != 3 || r.stdout != "a\n" {
				t.Errorf("exit 3: code %d, stdout %q, stderr %q", r.exit.GetCode(), r.stdout, r.stderr)
			}
			sb.reset(t)
		}
		if !strings.Contains(sb.log.String(), "forked_from="+tc.from+" reported=true") {
			t.Errorf("no run forked from the %s ended on its report:\n%s", tc.from, sb.log.String())
		}
	}

	// A process of the run other than its interpreter reports code 5.
	r := sb.mustRun(t, "python", endNameCode+"if os.fork() == 0:\n    report(5)\n    os._exit(0)\nos.wait()\ntime.sleep(0.3)\nprint('main', name is not None)")
	if r.exit.GetCode() != 0 || r.stdout != "main True\n" {
		t.Errorf("report by another process: code %d, stdout %q, stderr %q", r.exit.GetCode(), r.stdout, r.stderr)
	}
	sb.reset(t)

	// The interpreter reports code 7 and carries on: its run ends, and it
	// with it.
	start := time.Now()
	r = sb.run(t.Context(), &runnerv1.Run{Language: "python", Code: endNameCode + "open('outputs/early.txt', 'w').write('x')\nreport(7)\nwhile True:\n    open('late.txt', 'a').write('x')\n    time.sleep(0.01)", Timeout: durationpb.New(20 * time.Second)})
	if r.err != nil || r.exit.GetCode() != 7 || r.exit.GetTimedOut() || time.Since(start) > 10*time.Second {
		t.Errorf("early report: %v %v after %v, stderr %q", r.exit, r.err, time.Since(start), r.stderr)
	}
	sb.reset(t)
	if r := sb.mustRun(t, "python", "import numpy, os\n"+countUserProcsButParent+"\nprint(sorted(os.listdir('.')))"); r.stdout != "0\n['outputs']\n" {
		t.Errorf("after an early report: stdout %q, stderr %q", r.stdout, r.stderr)
	}
}

// preloadWorkload is the code models send, as the benchmarks run it.
var preloadWorkload = []struct{ name, lang, code string }{
	{"print", "python", "print(1)"},
	{"requests", "python", "import requests\nr = requests.Request('GET', 'http://127.0.0.1/x', params={'q': 1}).prepare()\nprint(r.url)"},
	{"numpy", "python", "import numpy as np\na = np.random.rand(500, 500)\nb = a @ a\nprint(np.linalg.eigvals(b)[:1].real)"},
	{"pandas", "python", "import numpy as np, pandas as pd\ndf = pd.DataFrame({'k': np.random.randint(0, 10, 10000), 'v': np.random.rand(10000)})\nprint(df.groupby('k').v.describe().shape)"},
	{"matplotlib", "python", "import numpy as np, matplotlib.pyplot as plt\nfig, (a, b) = plt.subplots(1, 2)\na.plot(np.arange(100) ** 0.5)\nb.hist(np.random.randn(1000), bins=30)\nfig.savefig('/workspace/outputs/plot.png')"},
	{"javascript", "javascript", "console.log(1)"},
}

// BenchmarkSandboxPreload runs the workload through the runner, each run
// followed by the Reset the agent makes, in a sandbox with a preloaded
// parent and in one without (fresh prestarted interpreters), in turn:
//
//	go test -run '^$' -bench SandboxPreload -benchtime 20x ./agent/internal/runner
func BenchmarkSandboxPreload(b *testing.B) {
	off := startSandboxOpts(b, buildRunner(b), "512m")
	on := startSandboxOpts(b, buildRunner(b), "512m", "-preload=default")
	ctx := b.Context()
	for _, w := range preloadWorkload {
		for _, mode := range []struct {
			name string
			sb   *sandbox
		}{{"fresh", off}, {"preload", on}} {
			b.Run(w.name+"/"+mode.name, func(b *testing.B) {
				sb := mode.sb
				cpu := sb.cpuUsage(b)
				// One run first, so that the prestart is in the language.
				if _, err := sb.c.Run(ctx, &runnerv1.Run{Language: w.lang, Code: w.code}, nil); err != nil {
					b.Fatal(err)
				}
				if err := sb.c.Reset(ctx); err != nil {
					b.Fatal(err)
				}
				var lat []time.Duration
				var runC, resC, resW time.Duration
				for b.Loop() {
					c0, start := cpu(), time.Now()
					exit, err := sb.c.Run(ctx, &runnerv1.Run{Language: w.lang, Code: w.code, Timeout: durationpb.New(60 * time.Second)}, nil)
					if err != nil || exit.GetCode() != 0 {
						b.Fatalf("run: %v %v", exit, err)
					}
					lat = append(lat, time.Since(start))
					c1, t1 := cpu(), time.Now()
					if err := sb.c.Reset(ctx); err != nil {
						b.Fatal(err)
					}
					runC += c1 - c0
					resC += cpu() - c1
					resW += time.Since(t1)
				}
				n := float64(len(lat))
				ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / n }
				b.ReportMetric(ms(runC), "run-cpu-ms")
				b.ReportMetric(ms(resW), "reset-ms")
				b.ReportMetric(ms(resC), "reset-cpu-ms")
				b.ReportMetric(float64(sb.memoryUsage(b))/(1<<20), "sandbox-MiB")
				testkit.ReportPercentiles(b, lat, time.Millisecond)
			})
		}
	}
}

// memoryUsage reads the memory the sandbox uses, from the host's cgroup
// (v1) of the container.
func (sb *sandbox) memoryUsage(b *testing.B) int64 {
	b.Helper()
	out, err := exec.Command("docker", "inspect", "--format", "{{.Id}}", sb.name).Output()
	if err != nil {
		b.Fatalf("docker inspect %s: %v", sb.name, err)
	}
	data, err := os.ReadFile("/sys/fs/cgroup/memory/docker/" + strings.TrimSpace(string(out)) + "/memory.usage_in_bytes")
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return n
}

// A fork bomb and a memory bomb in a sandbox with a preloaded parent: the
// scrub kills the bomb and spares the parent, the watchdog ends the memory
// bomb without the sandbox, and the next runs are forked as before.
func TestPreloadAbuse(t *testing.T) {
	t.Parallel()
	sb := startSandboxOpts(t, buildRunner(t), "512m", "-preload=default")
	ctx := t.Context()
	// The light parent's pid and the parent's.
	parent := func() string {
		t.Helper()
		var pids []string
		for _, mods := range []string{"numpy", "numpy, pandas"} {
			r := sb.mustRun(t, "python", "import os, "+mods+"; print(os.getppid())")
			sb.reset(t)
			p := strings.TrimSpace(r.stdout)
			if p == "1" || p == "" {
				t.Fatalf("not forked: %q %q", r.stdout, r.stderr)
			}
			pids = append(pids, p)
		}
		return strings.Join(pids, " ")
	}
	before := parent()
	r := sb.run(ctx, &runnerv1.Run{Language: "bash", Code: "(:(){ :|:& };:) >/dev/null 2>&1 & sleep 0.3; echo left", Stateful: true, Timeout: durationpb.New(10 * time.Second)})
	if r.err != nil || r.stdout != "left\n" {
		t.Fatalf("fork bomb: %v %q %q %v", r.exit, r.stdout, r.stderr, r.err)
	}
	sb.reset(t)
	if r := sb.mustRun(t, "python", "import numpy\n"+countUserProcsButParent); r.stdout != "0\n" {
		t.Fatalf("user processes after Reset: %q %q", r.stdout, r.stderr)
	}
	sb.reset(t)
	r = sb.run(ctx, &runnerv1.Run{Language: "python", Code: "import numpy\nx = []\nwhile True:\n    x.append(bytearray(16 << 20))", Timeout: durationpb.New(30 * time.Second)})
	if r.err != nil || !r.exit.GetOomKilled() {
		t.Fatalf("memory bomb: %v %v %q", r.exit, r.err, r.stderr)
	}
	sb.reset(t)
	if after := parent(); after != before {
		t.Errorf("parent %s before the bombs, %s after", before, after)
	}
}
