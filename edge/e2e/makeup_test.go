package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
	"github.com/codemode-go/codemode/internal/testkit/testenv"
)

// makeUpServices are the binaries `make up` starts, by executable name.
var makeUpServices = []string{"agent", "controlplane", "edge"}

// TestMakeUp runs the real `make up` from the repository root, as a user
// would, on loopback ports the test picks, and checks what the target
// promises: every listening socket of the three services is on 127.0.0.1,
// each service is given the cluster secret file (mode 0600, 32 random
// bytes), dockerd runs in a session of its own, and Ctrl-C (SIGINT to
// make's whole process group) stops all three without taking dockerd down,
// leaving no sandbox of this run's agent behind. While the stack is up, it
// checks the banner's lines for Claude Code and the MCP Inspector, runs
// the README's quick start against it (runQuickStart), and checks that the
// agent's default preloading reaches callers (checkPreloaded).
//
// It needs root and make, and prepares the host and builds bin/ as
// `make up` does: slow on the first run, seconds of setup afterwards.
func TestMakeUp(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t, "make up, which prepares the host,")
	dockertest.Need(t)
	root, dockerd := makeUpPreconditions(t)

	// The seed's forms of the variables (a bare port, :PORT): make up must
	// still bind them to loopback only.
	edgePort, cpPort, agentPort := freeLoopbackPort(t), freeLoopbackPort(t), freeLoopbackPort(t)
	ports := map[string]uint16{"edge": edgePort, "controlplane": cpPort, "agent": agentPort}
	agentName := fmt.Sprintf("e2e-makeup-%d", os.Getpid())
	logPath := filepath.Join(t.TempDir(), "make-up.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	logs := makeUpLogs(logPath)

	metricsAddrs := map[string]string{}
	for _, name := range makeUpServices {
		metricsAddrs[name] = freeLoopbackAddr(t)
	}
	cmd := exec.Command("make", "--no-print-directory", "up",
		fmt.Sprintf("EDGE_ADDR=:%d", edgePort),
		fmt.Sprintf("CONTROLPLANE_ADDR=:%d", cpPort),
		fmt.Sprintf("WORKER_PORT=%d", agentPort),
		"EDGE_METRICS_ADDR="+metricsAddrs["edge"], "CONTROLPLANE_METRICS_ADDR="+metricsAddrs["controlplane"],
		"AGENT_METRICS_ADDR="+metricsAddrs["agent"])
	cmd.Dir = root
	cmd.Env = append(makeFreeEnv(), "AGENT_NAME="+agentName, "MIN_ACTIVE=1", "AGENT_STATE_DIR="+t.TempDir())
	m, err := startMake(cmd, logFile)
	if err != nil {
		t.Fatalf("start make up: %v", err)
	}
	services := map[string]int{}
	t.Cleanup(func() {
		stopMakeUp(m.done, m.pgid, services, agentName)
	})

	// Wait for the edge, leaving time to stop the stack before the test
	// binary's deadline.
	waitForEdge(t, edgePort, m.done, &m.waitErr, logs)

	// The services are make's descendants, by executable name.
	findServices(t, cmd, &services, logs)

	t.Run("loopback only", func(t *testing.T) {
		checkLoopbackOnly(t, services, ports)
	})

	t.Run("cluster secret", func(t *testing.T) {
		checkClusterSecret(t, services)
	})

	t.Run("dockerd in its own session", func(t *testing.T) {
		checkDockerdSession(t, dockerd)
	})

	edgeAddr := fmt.Sprintf("127.0.0.1:%d", edgePort)
	t.Run("banner", func(t *testing.T) {
		checkBanner(t, root, edgeAddr, func() string {
			b, _ := os.ReadFile(logPath)
			return string(b)
		})
	})
	t.Run("README quick start", func(t *testing.T) { runQuickStart(t, root, edgeAddr) })
	t.Run("preloaded", func(t *testing.T) { checkPreloaded(t, "http://"+edgeAddr) })
	t.Run("metrics", func(t *testing.T) { checkMetrics(t, logPath, metricsAddrs) })

	stopByCtrlC(t, m.pgid, m.done, &m.waitErr, logPath, logs, services, dockerd, agentName)
}

// makeRun is make running in a process group of its own.
type makeRun struct {
	pgid    int           // of make's process group
	done    chan struct{} // closed when make has exited
	waitErr error         // make's exit, once done is closed
}

// startMake starts cmd, its output to logFile, in a process group of its
// own, like a shell's foreground job: the test's Ctrl-C goes to it and
// nowhere else.
func startMake(cmd *exec.Cmd, logFile *os.File) (*makeRun, error) {
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	m := &makeRun{pgid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		m.waitErr = cmd.Wait()
		close(m.done)
	}()
	return m, nil
}

// checkMetrics is TestMakeUp's "metrics": the banner in logPath prints
// each service's metrics address, by name in metricsAddrs, and each
// serves codemode's metrics there.
func checkMetrics(t *testing.T, logPath string, metricsAddrs map[string]string) {
	b, _ := os.ReadFile(logPath)
	for name, addr := range metricsAddrs {
		if !strings.Contains(string(b), "http://"+addr+"/metrics") {
			t.Errorf("the banner does not print %s's metrics address %s", name, addr)
		}
		res, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Errorf("%s's metrics: %v", name, err)
			continue
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if !strings.Contains(string(body), "codemode_build_info") {
			t.Errorf("%s's metrics at %s lack codemode_build_info:\n%.300s", name, addr, body)
		}
	}
}

// makeUpPreconditions skips unless make up can run here, and returns the
// repository root and the pid of dockerd.
func makeUpPreconditions(t *testing.T) (root string, dockerd int) {
	for _, tool := range []string{"make", "bash", "curl", "docker"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "make up needs %s: %v", tool, err)
		}
	}
	root = moduleRoot()
	if _, err := os.Stat(filepath.Join(root, "Makefile")); err != nil {
		testenv.Missing(t, "no Makefile at the repository root: %v", err)
	}
	dockerd, err := dockerdPID()
	if err != nil {
		t.Fatal(err)
	}
	return root, dockerd
}

// makeUpLogs returns the tail of make up's output in logPath, for failures.
func makeUpLogs(logPath string) func() string {
	return func() string {
		b, _ := os.ReadFile(logPath)
		const max = 16 << 10
		if len(b) > max {
			b = b[len(b)-max:]
		}
		return "--- make up output (tail) ---\n" + string(b)
	}
}

// stopMakeUp stops make up after a failure: Ctrl-C, then kill.
func stopMakeUp(done chan struct{}, pgid int, services map[string]int, agentName string) {
	// On failure: Ctrl-C, then kill. The services run in process
	// groups of their own (the recipe's set -m), so they are killed
	// one by one, and their sandboxes removed.
	select {
	case <-done:
	default:
		_ = syscall.Kill(-pgid, syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-done
		}
	}
	for name, pid := range services {
		if procRunning(pid, name) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	removeSandboxes(agentName)
}

// waitForEdge waits for the edge on edgePort, leaving time to stop the stack
// before the test binary's deadline; it fails if make up exits first.
func waitForEdge(t *testing.T, edgePort uint16, done chan struct{}, waitErr *error, logs func() string) {
	upBy := time.Now().Add(10 * time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-2*time.Minute).Before(upBy) {
		upBy = d.Add(-2 * time.Minute)
	}
	edgeURL := fmt.Sprintf("http://127.0.0.1:%d", edgePort)
	start := time.Now()
	if !testkit.Until(time.Until(upBy), func() bool {
		select {
		case <-done:
			t.Fatalf("make up exited before the edge answered: %v\n%s", *waitErr, logs())
		default:
		}
		return edgeAnswers(edgeURL)
	}) {
		t.Fatalf("edge did not answer at %s within %s\n%s", edgeURL, time.Since(start).Round(time.Second), logs())
	}
	t.Logf("make up answered after %s", time.Since(start).Round(time.Second))
}

// findServices waits for make's descendants to be the services, by executable
// name, and sets services to them.
func findServices(t *testing.T, cmd *exec.Cmd, services *map[string]int, logs func() string) {
	if !testkit.Until(10*time.Second, func() bool {
		found, err := descendants(cmd.Process.Pid, makeUpServices)
		if err != nil {
			t.Fatal(err)
		}
		*services = found
		return len(*services) == len(makeUpServices)
	}) {
		t.Fatalf("found %v among make's descendants, want %v\n%s", *services, makeUpServices, logs())
	}
}

// checkLoopbackOnly is TestMakeUp's "loopback only".
func checkLoopbackOnly(t *testing.T, services map[string]int, ports map[string]uint16) {
	for _, name := range makeUpServices {
		// The edge may answer before the agent has bound its port (it
		// checks its engine and image first): wait for it, on a loaded
		// host too.
		var addrs []netip.AddrPort
		testkit.Until(30*time.Second, func() bool {
			var err error
			if addrs, err = tcpListeners(services[name]); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return slices.ContainsFunc(addrs, func(a netip.AddrPort) bool { return a.Port() == ports[name] })
		})
		t.Logf("%s (pid %d) listens on %v", name, services[name], addrs)
		own := false
		for _, a := range addrs {
			if a.Addr().Unmap() != netip.AddrFrom4([4]byte{127, 0, 0, 1}) {
				t.Errorf("%s (pid %d) listens on %s, want 127.0.0.1 only", name, services[name], a)
			}
			own = own || a.Port() == ports[name]
		}
		if !own {
			t.Errorf("%s (pid %d) listens on %v, not on its port %d", name, services[name], addrs, ports[name])
		}
	}
}

// checkClusterSecret is TestMakeUp's "cluster secret".
func checkClusterSecret(t *testing.T, services map[string]int) {
	var path string
	for _, name := range makeUpServices {
		p, err := procEnv(services[name], "CODEMODE_CLUSTER_SECRET_FILE")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if p == "" || (path != "" && p != path) {
			t.Fatalf("%s has CODEMODE_CLUSTER_SECRET_FILE=%q, want the same non-empty path as the others (%q)", name, p, path)
		}
		path = p
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if secret, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b))); err != nil || len(secret) != 32 {
		t.Errorf("%s holds %d bytes of base64 (error %v), want 32", path, len(secret), err)
	}
}

// checkDockerdSession is TestMakeUp's "dockerd in its own session".
func checkDockerdSession(t *testing.T, dockerd int) {
	sid, err := unix.Getsid(dockerd)
	if err != nil {
		t.Fatalf("session of dockerd (pid %d): %v", dockerd, err)
	}
	mine, err := unix.Getsid(0)
	if err != nil {
		t.Fatal(err)
	}
	if sid == mine {
		t.Errorf("dockerd (pid %d) runs in the test's session %d: a Ctrl-C meant for make would reach it", dockerd, sid)
	}
}

// stopByCtrlC waits for a sandbox of agentName, sends Ctrl-C to make's group
// pgid, and checks that make up stopped its services and their sandboxes and
// left dockerd running.
func stopByCtrlC(t *testing.T, pgid int, done chan struct{}, waitErr *error, logPath string, logs func() string, services map[string]int, dockerd int, agentName string) {
	// A sandbox of this agent must exist, or "none left" would prove nothing.
	if !testkit.Until(2*time.Minute, func() bool { return countSandboxes(t, agentName) > 0 }) {
		t.Fatalf("agent %s made no sandbox within 2 minutes\n%s", agentName, logs())
	}

	// Ctrl-C, as a terminal sends it: to the whole foreground group.
	stopped := time.Now()
	if err := syscall.Kill(-pgid, syscall.SIGINT); err != nil {
		t.Fatalf("SIGINT to make's group: %v", err)
	}
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatalf("make up still runs 90s after Ctrl-C\n%s", logs())
	}
	t.Logf("make up stopped %s after Ctrl-C", time.Since(stopped).Round(time.Millisecond))
	if !endedByCtrlC(*waitErr) {
		t.Errorf("make up ended with %v, want exit 0 or death by SIGINT\n%s", *waitErr, logs())
	}
	if out, _ := os.ReadFile(logPath); !bytes.Contains(out, []byte("stopped")) {
		t.Errorf("make up did not report its services stopped\n%s", logs())
	}
	for name, pid := range services {
		if procRunning(pid, name) {
			t.Errorf("%s (pid %d) still runs after make up stopped", name, pid)
		}
	}
	if !procRunning(dockerd, "dockerd") {
		t.Fatalf("dockerd (pid %d) died with make up's Ctrl-C", dockerd)
	}
	if now, err := dockerdPID(); err != nil || now != dockerd {
		t.Errorf("docker.pid holds %d (%v), want the same dockerd %d", now, err, dockerd)
	}
	if n := countSandboxes(t, agentName); n != 0 {
		t.Errorf("%d codemode containers of agent %s remain after Ctrl-C\n%s", n, agentName, logs())
	}
}

// endedByCtrlC reports whether make ended as it should after Ctrl-C: GNU
// make waits for its recipe (which stops the services and exits 0), then
// dies of the SIGINT it got itself, as an interrupted program should.
func endedByCtrlC(err error) bool {
	if err == nil {
		return true
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGINT
}

// handedOut are the ports freeLoopbackPort has returned in this process.
var handedOut = struct {
	sync.Mutex
	ports map[uint16]bool
}{ports: map[uint16]bool{}}

// freeLoopbackPort returns a loopback TCP port that was free a moment ago
// and that it has not returned before in this process: the kernel may
// give a port just closed again, and two services told the same port do
// not both start (TestMakeUp's agent and its edge's metrics once did).
func freeLoopbackPort(t testing.TB) uint16 {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := uint16(ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
		if !handedOut.ports[port] {
			handedOut.ports[port] = true
			return port
		}
	}
	t.Fatal("no loopback port that was not handed out before, in 100 tries")
	return 0
}

// freeLoopbackAddr returns 127.0.0.1 with a port that was free a moment
// ago, for a process whose address must be known before it starts.
func freeLoopbackAddr(t testing.TB) string {
	return fmt.Sprintf("127.0.0.1:%d", freeLoopbackPort(t))
}

// makeFreeEnv is the test's environment without what an enclosing make
// (`make test`) leaves for its sub-makes: its jobserver is not ours.
func makeFreeEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES":
		default:
			env = append(env, kv)
		}
	}
	return env
}

// edgeAnswers reports whether the edge at url answers ListLanguages.
func edgeAnswers(url string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/codemode.edge.v1.ExecutionService/ListLanguages", strings.NewReader("{}"))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

func dockerdPID() (int, error) {
	b, err := os.ReadFile("/var/run/docker.pid")
	if err != nil {
		return 0, fmt.Errorf("dockerd's pid: %w", err)
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// procRunning reports whether pid is a live (not zombie) process running the
// executable named name.
func procRunning(pid int, name string) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	// TestMakeUpCluster's make, running beside, may rebuild bin/ after this
	// make started a service: the link then names the replaced file.
	exe = strings.TrimSuffix(exe, " (deleted)")
	if err != nil || filepath.Base(exe) != name {
		return false
	}
	state, _, err := procStat(pid)
	return err == nil && state != 'Z'
}

// procStat returns the state and parent of pid from /proc/PID/stat.
func procStat(pid int) (state byte, ppid int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// The command name is in parentheses and may hold anything: the
	// fields after it start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat: %q", pid, b)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("parse /proc/%d/stat: %q", pid, b)
	}
	ppid, err = strconv.Atoi(f[1])
	return f[0][0], ppid, err
}

// descendants returns the live descendants of pid whose executables bear
// one of names, by name.
func descendants(pid int, names []string) (map[string]int, error) {
	all, err := descendantPIDs(pid)
	if err != nil {
		return nil, err
	}
	found := map[string]int{}
	for _, p := range all {
		for _, name := range names {
			if procRunning(p, name) {
				found[name] = p
			}
		}
	}
	return found, nil
}

// descendantPIDs returns every live descendant of pid.
func descendantPIDs(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, err := procStat(p); err == nil {
			children[ppid] = append(children[ppid], p)
		}
	}
	var out []int
	for queue := children[pid]; len(queue) > 0; queue = queue[1:] {
		p := queue[0]
		queue = append(queue, children[p]...)
		out = append(out, p)
	}
	return out, nil
}

// tcpListeners returns the local addresses of the listening TCP sockets
// pid holds, from its descriptors and its network namespace's tables.
func tcpListeners(pid int) ([]netip.AddrPort, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if inode, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	var addrs []netip.AddrPort
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // header
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			const listen = "0A"
			if len(fields) < 10 || fields[3] != listen || !inodes[fields[9]] {
				continue
			}
			a, err := parseProcAddr(fields[1])
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("%s: %w", table, err)
			}
			addrs = append(addrs, a)
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	return addrs, nil
}

// parseProcAddr parses an address of /proc/net/tcp{,6}: the IP as 32-bit
// words in host byte order, in hex, then ':' and the port in hex.
func parseProcAddr(s string) (netip.AddrPort, error) {
	ipHex, portHex, ok := strings.Cut(s, ":")
	raw, err := hex.DecodeString(ipHex)
	if !ok || err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("bad address %q", s)
	}
	port, err := strconv.ParseUint(portHex, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bad port in %q: %w", s, err)
	}
	ip := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(ip[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(addr, uint16(port)), nil
}

// procEnv returns the value of key in pid's initial environment.
func procEnv(pid int, key string) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return "", err
	}
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(key+"=")); ok {
			return string(v), nil
		}
	}
	return "", nil
}

// removeSandboxes force-removes every container of the named agent, after
// a failed run; the test's context is gone by then.
func removeSandboxes(agent string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", "ps", "-aq", "--filter", "label=codemode.sandbox=1",
		"--filter", "label=codemode.agent="+agent).Output()
	if ids := strings.Fields(string(out)); err == nil && len(ids) > 0 {
		_ = exec.CommandContext(ctx, "docker", append([]string{"rm", "-f"}, ids...)...).Run()
	}
}
