package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
	"github.com/codemode-go/codemode/internal/testkit/promtext"
	"github.com/codemode-go/codemode/internal/testkit/testenv"
	"github.com/codemode-go/codemode/internal/testkit/testlog"
)

// TestMakeUpCluster runs the real `make up-cluster` on loopback ports the
// test picks, and checks what it promises: both edges answer, a session
// opened through one edge keeps its state through the other (each edge
// lists the control planes in its own order, and they share Redis), runs
// spread over the three agents, and Ctrl-C stops everything. Its Redis
// wants a password that no command line shows.
func TestMakeUpCluster(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t, "make up-cluster, which prepares the host,")
	dockertest.Need(t)
	for _, tool := range []string{"make", "bash", "curl", "redis-server"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("make up-cluster needs %s (make setup installs it): %v", tool, err)
		}
	}
	root := moduleRoot()
	port := func() string { return fmt.Sprintf("127.0.0.1:%d", freeLoopbackPort(t)) }
	edges := []string{port(), port()}
	agents := []string{port(), port(), port()}
	name := fmt.Sprintf("e2e-upcluster-%d", os.Getpid())
	redisAddr := port()
	// Where each service serves its metrics, in the order of its kind's
	// addresses.
	metrics := map[string][]string{"AGENTS": {port(), port(), port()}, "CONTROLPLANES": {port(), port()}, "EDGES": {port(), port()}}
	passwordFile := filepath.Join(t.TempDir(), "cluster-redis-password")
	logPath := filepath.Join(t.TempDir(), "make-up-cluster.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	logs := makeUpClusterLogs(logPath)
	cmd := exec.Command("make", "--no-print-directory", "up-cluster",
		"CLUSTER_NAME="+name,
		"CLUSTER_REDIS="+redisAddr,
		"CLUSTER_REDIS_PASSWORD_FILE="+passwordFile,
		"CLUSTER_AGENTS="+strings.Join(agents, " "),
		"CLUSTER_CONTROLPLANES="+port()+" "+port(),
		"CLUSTER_EDGES="+strings.Join(edges, " "))
	for kind, addrs := range metrics {
		cmd.Args = append(cmd.Args, "CLUSTER_"+kind+"_METRICS="+strings.Join(addrs, " "))
	}
	cmd.Dir = root
	// One warm sandbox per agent, preloading nothing (see agentPreload):
	// three agents with the default list took three quarters of this
	// test's time on two CPUs. TestMakeUp runs the defaults.
	cmd.Env = append(makeFreeEnv(), "MIN_ACTIVE=1", agentPreload)
	m, err := startMake(cmd, logFile)
	if err != nil {
		t.Fatal(err)
	}
	pgid := m.pgid
	t.Cleanup(func() {
		stopMakeUpCluster(m.done, pgid, agents, name)
	})
	waitForCluster(t, m.done, &m.waitErr, logPath, logs)

	if !t.Run("redis password", func(t *testing.T) {
		checkClusterRedisPassword(t, pgid, redisAddr, passwordFile)
	}) {
		t.FailNow()
	}

	t.Run("metrics", func(t *testing.T) {
		checkClusterMetrics(t, must(os.ReadFile(logPath)), metrics)
	})

	ctx := t.Context()
	client := func(i int) edgev1connect.ExecutionServiceClient {
		return edgev1connect.NewExecutionServiceClient(server.NewClient(), "http://"+edges[i])
	}
	// Every agent joins and takes runs, once its sandboxes are up (the
	// edges answer before that): bounded in runs and in time. Before any
	// session is open: an agent holding one has less free and, with runs
	// one at a time, would get none.
	runOnEveryAgent(t, ctx, client, agents, logs)

	t.Run("an agent killed is reported and restarted", func(t *testing.T) {
		checkAgentRestarted(t, pgid, logPath, client, agents, metrics["AGENTS"], logs)
	})

	sessionAcrossEdges(t, ctx, client, logs)
	stopClusterByCtrlC(t, pgid, m.done, &m.waitErr, logPath, logs)
}

// sessionAcrossEdges sets x in a session through the first edge and
// prints it through the second.
func sessionAcrossEdges(t *testing.T, ctx context.Context, client func(i int) edgev1connect.ExecutionServiceClient, logs func() string) {
	if _, err := client(0).Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "x = 6 * 7", SessionId: "upcluster"})); err != nil {
		t.Fatalf("session through edge 1: %v\n%s", err, logs())
	}
	res, err := client(1).Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(x)", SessionId: "upcluster"}))
	if err != nil || strings.TrimSpace(res.Msg.GetResult().GetStdout()) != "42" {
		t.Fatalf("the session through edge 2: %v %v, want 42\n%s", res, err, logs())
	}
}

// makeUpClusterLogs returns the tail of make up-cluster's output in logPath,
// for failures, without the line each service logs per run: those would
// fill the tail and hide what the services said of themselves.
func makeUpClusterLogs(logPath string) func() string {
	return func() string {
		b, _ := os.ReadFile(logPath)
		var kept []string
		runs := 0
		for line := range strings.Lines(string(b)) {
			if strings.Contains(line, " msg=execution ") {
				runs++
				continue
			}
			kept = append(kept, line)
		}
		return fmt.Sprintf("--- make up-cluster output (tail, without its %d lines logging a run) ---\n%s", runs, testlog.Tail(strings.Join(kept, ""), 16<<10))
	}
}

// stopMakeUpCluster stops make up-cluster after a failure, Ctrl-C then kill,
// and removes its agents' sandboxes and state.
func stopMakeUpCluster(done chan struct{}, pgid int, agents []string, name string) {
	select {
	case <-done:
	default:
		_ = syscall.Kill(-pgid, syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-done
		}
	}
	for i := range agents {
		removeSandboxes(fmt.Sprintf("%s-%d", name, i+1))
		_ = os.RemoveAll(filepath.Join("/var/lib/codemode/agents", fmt.Sprintf("%s-%d", name, i+1)))
	}
}

// waitForCluster waits for make up-cluster to say the cluster is up, leaving
// time to stop it before the test binary's deadline.
func waitForCluster(t *testing.T, done chan struct{}, waitErr *error, logPath string, logs func() string) {
	upBy := time.Now().Add(10 * time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-2*time.Minute).Before(upBy) {
		upBy = d.Add(-2 * time.Minute)
	}
	if !testkit.Until(time.Until(upBy), func() bool {
		select {
		case <-done:
			t.Fatalf("make up-cluster exited before it was up: %v\n%s", *waitErr, logs())
		default:
		}
		return bytes.Contains(must(os.ReadFile(logPath)), []byte("the codemode cluster is up"))
	}) {
		t.Fatalf("make up-cluster not up in time\n%s", logs())
	}
}

// runOnEveryAgent runs through both edges until every agent has taken a run,
// bounded in runs and in time.
func runOnEveryAgent(t *testing.T, ctx context.Context, client func(i int) edgev1connect.ExecutionServiceClient, agents []string, logs func() string) {
	seen := map[string]bool{}
	for i, deadline := 0, time.Now().Add(2*time.Minute); i < 300 && len(seen) < len(agents) && time.Now().Before(deadline); i++ {
		res, err := client(i%2).Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"}))
		if connect.CodeOf(err) == connect.CodeUnavailable {
			// No agent has warmed its sandboxes yet: agents join
			// routing once warm.
			time.Sleep(200 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		seen[res.Msg.GetResult().GetAgent()] = true
	}
	if len(seen) != len(agents) {
		t.Errorf("runs reached agents %v, want all %d\n%s", seen, len(agents), logs())
	}
}

// stopClusterByCtrlC sends Ctrl-C to make's group pgid and checks that make
// up-cluster stopped.
func stopClusterByCtrlC(t *testing.T, pgid int, done chan struct{}, waitErr *error, logPath string, logs func() string) {
	if err := syscall.Kill(-pgid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		t.Fatalf("make up-cluster still runs 90s after Ctrl-C\n%s", logs())
	}
	if !endedByCtrlC(*waitErr) || !bytes.Contains(must(os.ReadFile(logPath)), []byte("stopped")) {
		t.Errorf("make up-cluster ended with %v, want stopped by Ctrl-C\n%s", *waitErr, logs())
	}
}

func must(b []byte, _ error) []byte { return b }

// checkClusterMetrics checks that make up-cluster's banner prints each
// service's metrics address (metrics: by kind, CLUSTER_<kind>_METRICS),
// each its own, and that each serves the service's Prometheus metrics.
func checkClusterMetrics(t *testing.T, banner []byte, metrics map[string][]string) {
	t.Helper()
	seen := map[string]bool{}
	for kind, addrs := range metrics {
		for i, addr := range addrs {
			if seen[addr] {
				t.Fatalf("%s given twice", addr)
			}
			seen[addr] = true
			u := "http://" + addr + "/metrics"
			if !bytes.Contains(banner, []byte(u)) {
				t.Errorf("the banner does not print %s (%s %d)", u, kind, i+1)
			}
			res, err := http.Get(u)
			if err != nil {
				t.Errorf("%s %d's metrics: %v", kind, i+1, err)
				continue
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusOK || !bytes.Contains(body, []byte("codemode_build_info")) {
				t.Errorf("%s %d's metrics at %s: HTTP %d without codemode_build_info:\n%.300s", kind, i+1, addr, res.StatusCode, body)
			}
		}
	}
}

// checkClusterRedisPassword checks what make up-cluster promises of its
// Redis's password: made in passwordFile (mode 0600, 32 random bytes in
// URL-safe base64), required by the Redis at addr, given to each control
// plane in REDIS_URL, and on no command line of make's descendants.
func checkClusterRedisPassword(t *testing.T, makePID int, addr, passwordFile string) {
	t.Helper()
	if got := redisSays(t, addr, "PING"); !strings.HasPrefix(got, "-NOAUTH") {
		t.Errorf("Redis on %s answers PING without the password with %q, want -NOAUTH", addr, got)
	}
	fi, err := os.Stat(passwordFile)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", passwordFile, fi.Mode().Perm())
	}
	password := strings.TrimSpace(string(must(os.ReadFile(passwordFile))))
	if raw, err := base64.RawURLEncoding.DecodeString(password); err != nil || len(raw) != 32 {
		t.Fatalf("the password file holds %d bytes of URL-safe base64 (error %v), want 32", len(raw), err)
	}
	if got := redisSays(t, addr, "AUTH "+password+"\r\nPING"); got != "+OK\r\n+PONG" {
		t.Errorf("Redis on %s answers AUTH and PING with %q, want +OK, +PONG", addr, got)
	}
	pids, err := descendantPIDs(makePID)
	if err != nil {
		t.Fatal(err)
	}
	controlplanes := 0
	for _, pid := range pids {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue // exited
		}
		if bytes.Contains(cmdline, []byte(password)) || bytes.Contains(cmdline, []byte("redis-url")) {
			t.Errorf("pid %d has the Redis password or URL on its command line: %q", pid, bytes.ReplaceAll(cmdline, []byte(password), []byte("<password>")))
		}
		if !procRunning(pid, "controlplane") {
			continue
		}
		controlplanes++
		v, err := procEnv(pid, "REDIS_URL")
		if err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(v)
		if err != nil {
			t.Fatalf("control plane %d: REDIS_URL does not parse: %v", pid, err)
		}
		if p, _ := u.User.Password(); u.Host != addr || p != password {
			t.Errorf("control plane %d: REDIS_URL names %s with the password %v, want %s with the file's", pid, u.Host, p == password, addr)
		}
	}
	if controlplanes != 2 {
		t.Errorf("found %d control planes among make's descendants, want 2", controlplanes)
	}
}

// redisSays sends the inline commands cmds (lines joined by CRLF) to the
// Redis at addr and returns its answers, one line each, joined by CRLF.
func redisSays(t *testing.T, addr, cmds string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(cmds + "\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var lines []string
	for range strings.Count(cmds, "\r\n") + 1 {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read Redis's answer: %v (so far %q)", err, lines)
		}
		lines = append(lines, strings.TrimRight(line, "\r\n"))
	}
	return strings.Join(lines, "\r\n")
}

// checkAgentRestarted kills one agent of make up-cluster (make's group
// pgid) with SIGKILL: make up-cluster says so, the cluster goes on serving
// runs through both edges, and the agent is started again, reports itself
// ready at its metrics (one of metrics), and takes runs.
func checkAgentRestarted(t *testing.T, pgid int, logPath string, client func(i int) edgev1connect.ExecutionServiceClient, agents, metrics []string, logs func() string) {
	agentPIDs := func() []int {
		pids, err := descendantPIDs(pgid)
		if err != nil {
			t.Fatal(err)
		}
		var out []int
		for _, pid := range pids {
			if procRunning(pid, "agent") {
				out = append(out, pid)
			}
		}
		return out
	}
	before := agentPIDs()
	if len(before) != len(agents) {
		t.Fatalf("agent processes %v, want %d", before, len(agents))
	}
	if err := syscall.Kill(before[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "make up-cluster to report the death", func() bool {
		return bytes.Contains(must(os.ReadFile(logPath)), []byte("exited (killed by signal 9); the others go on serving"))
	})
	for i := range 6 {
		if _, err := client(i%2).Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"})); err != nil {
			t.Fatalf("run %d with an agent down: %v\n%s", i, err, logs())
		}
	}
	testkit.WaitFor(t, 60*time.Second, "the agent started again", func() bool {
		now := agentPIDs()
		return len(now) == len(agents) && !slices.Contains(now, before[0])
	})
	// The new agent joins routing once its pool has warmed, which on a
	// loaded host takes a while; wait for that apart from the runs, so
	// that a failure says which of the two did not happen.
	waitAgentsReady(t, metrics, logs)
	runOnEveryAgent(t, t.Context(), client, agents, logs)
}

// waitAgentsReady waits, bounded, until every agent whose metrics are
// served at one of addrs reports codemode_agent_ready 1.
func waitAgentsReady(t *testing.T, addrs []string, logs func() string) {
	t.Helper()
	notReady := func() []string {
		var out []string
		for _, addr := range addrs {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			fams, err := promtext.Scrape(ctx, "http://"+addr+"/metrics")
			cancel()
			if err != nil || promtext.Sample(fams, "codemode_agent_ready", nil) != 1 {
				out = append(out, addr)
			}
		}
		return out
	}
	if !testkit.Until(3*time.Minute, func() bool { return len(notReady()) == 0 }) {
		t.Fatalf("the agents with metrics at %v are not ready 3 minutes after the restart\n%s", notReady(), logs())
	}
}
