package agentd

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/codemode-go/codemode/agent/internal/sandbox"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// TestStatelessIsolation runs A, which leaves files, background processes
// (setsid, nohup, double fork, a delayed writer) and a changed working
// directory behind, then B, which must see none of it. The agent has one
// sandbox, so B runs in the very sandbox A ran in, scrubbed.
func TestStatelessIsolation(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) {
		c.MinActive = 1
		c.MaxSandboxes = 1
		c.MaxSessions = 0
	})
	a.waitWarm(t, 1)
	before := a.containerIDs(t)

	resA := a.exec(t, &executionv1.Execution{Language: "bash", Code: `
echo secret > /workspace/a.txt; echo secret > /workspace/outputs/a.txt; mkdir -p /workspace/dir; echo s > /workspace/dir/b
echo secret > /tmp/t.txt; echo secret > /dev/shm/s.txt
setsid sleep 300 >/dev/null 2>&1 </dev/null &
nohup sleep 301 >/dev/null 2>&1 </dev/null &
( ( sleep 302 >/dev/null 2>&1 </dev/null & ) & )
python3 -c '
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(1)
        open("/workspace/late.txt", "w").write("late")
        time.sleep(300)
    os._exit(0)
'
(sleep 1; echo late > /tmp/late.txt) </dev/null >/dev/null 2>&1 &
cd /tmp
echo started`})
	if resA.GetStdout() != "started\n" {
		t.Fatalf("run A: %v", resA)
	}
	// Give A's delayed writers time to write, if they survived.
	time.Sleep(1500 * time.Millisecond)

	resB := a.exec(t, &executionv1.Execution{Language: "bash", Code: `
pwd
ls -A /workspace /workspace/outputs /tmp /dev/shm
for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -E '^(sleep|python3) ' || true`})
	want := "/workspace\n/dev/shm:\n\n/tmp:\n\n/workspace:\noutputs\n\n/workspace/outputs:\n"
	if resB.GetStdout() != want {
		t.Errorf("run B saw what A left:\n%s\nstderr: %s\nwant:\n%s", resB.GetStdout(), resB.GetStderr(), want)
	}

	// Python: A plants start-up hooks where a new interpreter loads them
	// (the user site directory under HOME=/workspace) and shows that one
	// does; B runs in the interpreter prestarted after the scrub, which
	// must have loaded none of them.
	resA2 := a.exec(t, &executionv1.Execution{Language: "python", Code: `
import os, site, subprocess, sys
d = site.getusersitepackages()
os.makedirs(d, exist_ok=True)
open(os.path.join(d, "planted.pth"), "w").write("import sys; print('planted pth')\n")
sys.stdout.flush()
subprocess.run([sys.executable, "-c", "pass"])`})
	if got := resA2.GetStdout(); !strings.Contains(got, "planted pth") {
		t.Fatalf("run A2 could not plant a start-up hook: %q %q", got, resA2.GetStderr())
	}
	// A loaded hook would print before B2's own line. (The image's empty
	// usercustomize in the standard library shadows one planted in the user
	// site directory, so a .pth file is the hook that would load.)
	resB2 := a.exec(t, &executionv1.Execution{Language: "python", Code: `print("clean")`})
	if got := resB2.GetStdout(); got != "clean\n" {
		t.Errorf("run B2's interpreter loaded what A2 planted: %q %q", got, resB2.GetStderr())
	}

	after := a.containerIDs(t)
	if len(before) != 1 || len(after) != 1 || before[0] != after[0] {
		t.Errorf("containers before %v, after %v: want A and B in one sandbox", before, after)
	}
}

// ipcProbe is Python that creates (with create true) or looks for every
// kind of IPC object a run can leave in its sandbox, under names and keys
// derived from tag (a line put before it sets tag and create), and prints
// one line per kind with the errno of the attempt (0: it worked). Last, it
// lists the POSIX message queues of the sandbox's IPC namespace, which have
// no directory in the sandbox: it enters a user namespace of its own, where
// it may mount the mqueue file system (gVisor then shows the sandbox's
// queues).
const ipcProbe = `
import ctypes, os, sys, zlib
libc = ctypes.CDLL(None, use_errno=True)
libc.sem_open.restype = ctypes.c_void_p
name = ("/" + tag).encode()
key = zlib.crc32(tag.encode()) & 0x7fffffff
def err(ok):
    return 0 if ok else ctypes.get_errno()
flags = (os.O_CREAT | os.O_EXCL | os.O_RDWR) if create else os.O_RDONLY
mqd = libc.mq_open(name, flags, ctypes.c_uint(0o666), None)
print("mq_open", err(mqd >= 0))
if create and mqd >= 0:
    # gVisor has no mq_timedsend (ENOSYS); Linux queues the message.
    print("mq_send", err(libc.mq_send(mqd, b"secret", ctypes.c_size_t(6), ctypes.c_uint(0)) == 0), file=sys.stderr)
print("shm_open", err(libc.shm_open(name, flags, ctypes.c_uint(0o666)) >= 0))
print("sem_open", err(libc.sem_open(name + b"-sem", flags & ~os.O_RDWR, ctypes.c_uint(0o666), ctypes.c_uint(1)) is not None))
ipc = 0o1666 if create else 0
print("shmget", err(libc.shmget(key, 4096 if create else 0, ipc) >= 0))
print("msgget", err(libc.msgget(key, ipc) >= 0))
print("semget", err(libc.semget(key, 1 if create else 0, ipc) >= 0))
sys.stdout.flush()
def mqueues():
    c = ctypes.c_long
    if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
        return None, "unshare: " + os.strerror(ctypes.get_errno())
    fs = libc.syscall(c(430), b"mqueue", c(1))  # fsopen(FSOPEN_CLOEXEC)
    if fs < 0:
        return None, "fsopen: " + os.strerror(ctypes.get_errno())
    if libc.syscall(c(431), c(fs), c(6), None, None, c(0)) != 0:  # fsconfig(FSCONFIG_CMD_CREATE)
        return None, "fsconfig: " + os.strerror(ctypes.get_errno())
    mnt = libc.syscall(c(432), c(fs), c(1), c(0))  # fsmount(FSMOUNT_CLOEXEC)
    if mnt < 0:
        return None, "fsmount: " + os.strerror(ctypes.get_errno())
    return sorted(os.listdir(os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=mnt))), None
names, why = mqueues()
if names is None:
    print("cannot list message queues:", why, file=sys.stderr)
else:
    print("mqueues", " ".join(names))
`

// TestStatelessIsolationIPC runs A, which leaves one IPC object of every
// kind behind (a POSIX message queue, POSIX shared memory and a named
// semaphore, System V shared memory, a message queue and a semaphore set),
// then B, which must find none of them, in the same sandbox, scrubbed.
// POSIX message queues have no file in the sandbox; B also lists them as
// user code can.
func TestStatelessIsolationIPC(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) {
		c.MinActive = 1
		c.MaxSandboxes = 1
		c.MaxSessions = 0
	})
	a.waitWarm(t, 1)
	before := a.containerIDs(t)
	tag := randomName("codemode-ipc")
	probe := func(create string) *executionv1.Result {
		return a.exec(t, &executionv1.Execution{Language: "python", Code: fmt.Sprintf("tag, create = %q, %s\n", tag, create) + ipcProbe})
	}

	resA := probe("True")
	kinds := "mq_open %d\nshm_open %d\nsem_open %d\nshmget %d\nmsgget %d\nsemget %d\n"
	created := fmt.Sprintf(kinds, 0, 0, 0, 0, 0, 0)
	if !strings.HasPrefix(resA.GetStdout(), created) {
		t.Fatalf("run A could not create its IPC objects:\n%s\nstderr: %s\nwant:\n%s", resA.GetStdout(), resA.GetStderr(), created)
	}
	// The listing is the stronger check of B; where user code cannot list
	// (user namespaces turned off), B is checked by names only.
	listed := strings.Contains(resA.GetStdout(), "\nmqueues "+tag+"\n")
	if !listed {
		t.Logf("run A cannot list message queues: %q %q", resA.GetStdout(), resA.GetStderr())
	}

	resB := probe("False")
	const enoent = 2
	want := fmt.Sprintf(kinds, enoent, enoent, enoent, enoent, enoent, enoent)
	if listed {
		want += "mqueues \n"
	}
	if got := resB.GetStdout(); got != want {
		t.Errorf("run B found what A left:\n%s\nstderr: %s\nwant:\n%s", got, resB.GetStderr(), want)
	}

	after := a.containerIDs(t)
	if len(before) != 1 || len(after) != 1 || before[0] != after[0] {
		t.Errorf("containers before %v, after %v: want A and B in one sandbox", before, after)
	}
}

// containerIDs lists the ids of the agent's containers.
func (a *testAgent) containerIDs(t testing.TB) []string {
	t.Helper()
	list, err := a.Driver().Client().ContainerList(t.Context(), container.ListOptions{All: true, Filters: filters.NewArgs(
		filters.Arg("label", sandbox.LabelAgent+"="+a.cfg.Name))})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range list {
		ids = append(ids, c.ID)
	}
	return ids
}

// TestSessionIsolation shows that a session's files are seen by the session
// only: not by another session, not by stateless runs.
func TestSessionIsolation(t *testing.T) {
	t.Parallel()
	a := shared(t)
	s1, s2 := randomName("iso1"), randomName("iso2")
	t.Cleanup(func() {
		a.client("connect").CloseSession(context.Background(), connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: s1}))
		a.client("connect").CloseSession(context.Background(), connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: s2}))
	})
	res := a.exec(t, &executionv1.Execution{Language: "bash", SessionId: s1, Code: "echo mine > /workspace/s1.txt; echo mine > /workspace/outputs/s1.txt; echo ok"})
	if res.GetStdout() != "ok\n" || res.GetSessionId() != s1 {
		t.Fatalf("session 1: %v", res)
	}
	// Every run finds an outputs directory, empty unless it is its session's.
	const empty = "/workspace:\noutputs\n\n/workspace/outputs:\nend\n"
	res = a.exec(t, &executionv1.Execution{Language: "bash", SessionId: s2, Code: "ls -A /workspace /workspace/outputs; echo end"})
	if res.GetStdout() != empty {
		t.Errorf("session 2 sees %q", res.GetStdout())
	}
	for range 3 {
		res = a.exec(t, &executionv1.Execution{Language: "bash", Code: "ls -A /workspace /workspace/outputs; echo end"})
		if res.GetStdout() != empty {
			t.Errorf("stateless run sees %q", res.GetStdout())
		}
	}
	res = a.exec(t, &executionv1.Execution{Language: "bash", SessionId: s1, Code: "cat /workspace/s1.txt"})
	if res.GetStdout() != "mine\n" {
		t.Errorf("session 1 lost its file: %v", res)
	}
	if !strings.Contains(res.GetAgent(), "test-shared") {
		t.Errorf("agent %q", res.GetAgent())
	}
}
