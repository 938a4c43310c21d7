package agentd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/client"

	"github.com/codemode-go/codemode/agent/internal/languages"
	"github.com/codemode-go/codemode/agent/internal/sandbox"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
	"github.com/codemode-go/codemode/internal/testkit/testlog"
)

// TestShutdownRemovesSandboxes stops an agent with warm sandboxes, a
// session and a run in progress, and finds none of its containers left.
func TestShutdownRemovesSandboxes(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) { c.MinActive = 2; c.MaxSandboxes = 4 })
	a.waitWarm(t, 2)
	if r := a.exec(t, &executionv1.Execution{Language: "bash", Code: "echo hi", SessionId: "s"}); r.GetStdout() != "hi\n" {
		t.Fatalf("session run: %v", r)
	}
	// A long run that shutdown must cut.
	done := make(chan error, 1)
	go func() {
		_, err := a.client("connect").Execute(context.Background(), connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{Language: "bash", Code: "sleep 120"}}))
		done <- err
	}()
	testkit.WaitFor(t, 30*time.Second, "the long run to start", func() bool { return a.pool.Stats().Busy == 1 })
	if len(a.containerIDs(t)) < 2 {
		t.Fatalf("containers before shutdown: %v", a.containerIDs(t))
	}
	a.ShutdownTimeoutForTest(time.Second)
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	if ids := a.containerIDs(t); len(ids) != 0 {
		t.Errorf("containers after shutdown: %v", ids)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Error("run in progress did not end at shutdown")
	}
}

// ShutdownTimeoutForTest lowers the server's graceful-shutdown bound of an
// agent not yet serving... or serving: it applies to the next shutdown.
func (a *testAgent) ShutdownTimeoutForTest(d time.Duration) { a.cfg.ShutdownTimeout = d }

// TestLeftoversReaped starts an agent after a container of the same agent
// name was left behind, and finds it removed.
func TestLeftoversReaped(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	name := randomName("test-reap")
	d, err := sandbox.NewDocker("", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	leftover, err := d.Start(t.Context(), sandbox.Spec{
		Image: DefaultConfig().Image, Runtime: "runsc", Command: []string{"/bin/sleep", "600"}, User: "65534:65534",
		MemoryBytes: 64 << 20, NanoCPUs: 1e8, PidsLimit: 128, Labels: map[string]string{sandbox.LabelAgent: name},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer leftover.Remove(context.Background())
	a := startAgent(t, func(c *Config) { c.Name = name; c.MinActive = 0 })
	if _, err := d.Client().ContainerInspect(t.Context(), leftover.ID()); !client.IsErrNotFound(err) {
		t.Errorf("leftover container still there after start: %v", err)
	}
	if ids := a.containerIDs(t); len(ids) != 0 {
		t.Errorf("containers: %v", ids)
	}
}

// TestSandboxDeath kills a sandbox under a run: the run gets a clear
// error, and the next run gets a new sandbox. A warm sandbox killed while
// idle is replaced without any run noticing.
func TestSandboxDeath(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) { c.MinActive = 1; c.MaxSandboxes = 1; c.MaxSessions = 0 })
	a.waitWarm(t, 1)
	ids := a.containerIDs(t)
	if len(ids) != 1 {
		t.Fatalf("containers %v", ids)
	}
	done := make(chan error, 1)
	go func() {
		_, err := a.client("grpc").Execute(context.Background(), connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{Language: "bash", Code: "echo started; sleep 60"}}))
		done <- err
	}()
	testkit.Until(30*time.Second, func() bool { return a.pool.Stats().Busy > 0 })
	time.Sleep(300 * time.Millisecond) // and for the run to be in the sandbox, past "echo started"
	if err := a.Driver().Client().ContainerKill(t.Context(), ids[0], "KILL"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "replaced") {
			t.Errorf("run in a killed sandbox: %v, want unavailable", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run in a killed sandbox did not end")
	}
	if r := a.exec(t, &executionv1.Execution{Language: "python", Code: "print(2)"}); r.GetStdout() != "2\n" {
		t.Errorf("next run: %v", r)
	}

	// Kill the warm sandbox while it waits.
	a.waitWarm(t, 1)
	ids = a.containerIDs(t)
	if err := a.Driver().Client().ContainerKill(t.Context(), ids[0], "KILL"); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "the killed sandbox to stop", func() bool {
		info, err := a.Driver().Client().ContainerInspect(t.Context(), ids[0])
		return err != nil || !info.State.Running
	})
	time.Sleep(200 * time.Millisecond) // for the engine to close its attach stream
	if r := a.exec(t, &executionv1.Execution{Language: "python", Code: "print(3)"}); r.GetStdout() != "3\n" {
		t.Errorf("run after the warm sandbox died: %v", r)
	}
}

// TestEngineAway cuts the agent off its container engine (a proxy on the
// engine's socket stands in for a crashed and restarted dockerd: restarting
// the real one would kill the sandboxes of every other test on this host).
// The agent answers unavailable meanwhile, then reconnects, removes what
// it lost and fills its pool again.
func TestEngineAway(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	target := "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		if !strings.HasPrefix(h, "unix://") {
			t.Skip("the engine proxy needs a unix socket engine")
		}
		target = strings.TrimPrefix(h, "unix://")
	}
	p := &engineProxy{path: filepath.Join(t.TempDir(), "docker.sock"), target: target}
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.crash) // after the agent's own clean-up, registered later
	a := startAgent(t, func(c *Config) { c.DockerHost = "unix://" + p.path; c.MinActive = 1; c.MaxSandboxes = 2 })
	t.Cleanup(func() { p.start() }) // so that the agent can clean up if the test failed while cut off
	a.waitWarm(t, 1)
	if r := a.exec(t, &executionv1.Execution{Language: "python", Code: "print(1)"}); r.GetStdout() != "1\n" {
		t.Fatalf("run: %v", r)
	}
	if h := a.health(t); h != "SERVING_STATUS_SERVING" {
		t.Errorf("health %s, want SERVING", h)
	}
	a.waitWarm(t, 1)
	before := a.containerIDs(t)

	p.crash()
	_, err := a.client("connect").Execute(t.Context(), connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{Language: "python", Code: "print(1)"}}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("run with the engine away: %v, want unavailable", err)
	}
	testkit.WaitFor(t, 10*time.Second, "status not ready", func() bool { return !a.status(t).GetReady() })
	testkit.WaitFor(t, 10*time.Second, "health NOT_SERVING", func() bool { return a.health(t) == "SERVING_STATUS_NOT_SERVING" })
	_, err = a.client("connect").Execute(t.Context(), connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{Language: "python", Code: "print(1)"}}))
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Errorf("run while not ready: %v, want unavailable", err)
	}

	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 30*time.Second, "status ready again", func() bool { return a.status(t).GetReady() })
	testkit.WaitFor(t, 10*time.Second, "health SERVING", func() bool { return a.health(t) == "SERVING_STATUS_SERVING" })
	a.waitWarm(t, 1)
	if r := a.exec(t, &executionv1.Execution{Language: "python", Code: "print(2)"}); r.GetStdout() != "2\n" {
		t.Errorf("run after reconnecting: %v", r)
	}
	after := a.containerIDs(t)
	for _, id := range before {
		if slices.Contains(after, id) {
			t.Errorf("container %s from before the engine went away was not removed", id[:12])
		}
	}
}

func (a *testAgent) status(t testing.TB) *agentv1.AgentStatus {
	t.Helper()
	res, err := a.client("connect").Status(t.Context(), connect.NewRequest(&agentv1.StatusRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	return res.Msg.GetStatus()
}

// health asks the gRPC health service (over Connect JSON) for the agent's
// status: "SERVING_STATUS_SERVING" or "SERVING_STATUS_NOT_SERVING".
func (a *testAgent) health(t testing.TB) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, a.URL+"/grpc.health.v1.Health/Check", strings.NewReader(`{"service":"codemode.agent.v1.AgentService"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := server.NewClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body struct{ Status string }
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.Status
}

// engineProxy forwards a unix socket to the engine's; crash cuts every
// connection and stops listening, start listens again.
type engineProxy struct {
	path, target string

	mu    sync.Mutex
	ln    net.Listener
	conns map[net.Conn]bool
}

func (p *engineProxy) start() error {
	p.mu.Lock()
	up := p.ln != nil
	p.mu.Unlock()
	if up {
		return nil
	}
	ln, err := net.Listen("unix", p.path)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ln = ln
	p.conns = map[net.Conn]bool{}
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("unix", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			if p.conns == nil {
				p.mu.Unlock()
				c.Close()
				up.Close()
				return
			}
			p.conns[c], p.conns[up] = true, true
			p.mu.Unlock()
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.Copy(c, up); c.Close() }()
		}
	}()
	return nil
}

func (p *engineProxy) crash() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	if err := os.Remove(p.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		panic(err)
	}
}

// TestMissingImage refuses to start without the sandbox image, saying how
// to build it, and never pulls.
func TestMissingImage(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	cfg := testConfig("test-noimage")
	cfg.Image = "codemode-no-such-image:never"
	_, err := New(t.Context(), cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "make setup") {
		t.Errorf("New with a missing image: %v", err)
	}
}

// TestWarmPoolShrinksAfterBurst lets a burst grow the warm pool beyond
// --min-active and sees it shrink back once those sandboxes idle.
func TestWarmPoolShrinksAfterBurst(t *testing.T) {
	t.Parallel()
	a := startAgent(t, func(c *Config) { c.MinActive = 1; c.MaxSandboxes = 3; c.MaxSessions = 0; c.WarmIdle = 15 * time.Second })
	a.waitWarm(t, 1)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			a.exec(t, &executionv1.Execution{Language: "bash", Code: "sleep 1"})
		})
	}
	wg.Wait()
	// The three come back from their scrubs seconds apart on a loaded
	// machine; WarmIdle is long enough that the first is still warm when
	// the last returns.
	testkit.WaitFor(t, 60*time.Second, "three warm sandboxes after the burst", func() bool { return a.pool.Stats().Warm == 3 })
	testkit.WaitFor(t, 60*time.Second, "the warm pool back to one", func() bool { return a.pool.Stats().Warm == 1 && len(a.containerIDs(t)) == 1 })
}

// TestRun runs the binary's Run with flags, serves a run over gRPC, stops
// it as SIGTERM would (its context ends), and finds no container left.
// It preloads nothing, as testConfig's agents do.
func TestRun(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	name := randomName("test-run")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, []string{"--addr", "127.0.0.1:0", "--name", name, "--runner", runnerBin,
			"--min-active", "1", "--max-sandboxes", "2", "--max-sessions", "1", "--preload", "none", "--log-format", "json"}, nil, io.Discard, pw)
		pw.Close()
	}()
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "listening" {
				addrc <- rec.Addr
			}
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("Run returned before listening: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("Run did not listen within a minute")
	}
	ta := &testAgent{URL: "http://" + addr}
	res, err := ta.client("grpc").Execute(ctx, connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{Language: "python", Code: "print(6*7)"}}))
	if err != nil || res.Msg.GetResult().GetStdout() != "42\n" || res.Msg.GetResult().GetAgent() != name {
		t.Fatalf("Execute: %v, %v", res, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Run did not return within a minute of its context ending")
	}
	d, err := sandbox.NewDocker("", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	list, err := d.Client().ContainerList(t.Context(), container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", sandbox.LabelAgent+"="+name))})
	if err != nil || len(list) != 0 {
		t.Errorf("containers after Run returned: %d, %v", len(list), err)
	}
}

// TestImageWithoutAnInterpreter runs the agent on an image derived from
// the sandbox image with Node.js removed: it warns at start-up naming
// what is missing, lists javascript with no version, answers a JavaScript
// run with failed_precondition naming node, and keeps running the rest.
func TestImageWithoutAnInterpreter(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	a, logs := startOnDerivedImage(t, "test-no-node", "rm -f /usr/bin/node /usr/bin/nodejs", func(c *Config) {
		c.MinActive, c.MaxSandboxes, c.MaxSessions = 1, 2, 0
	})
	a.waitWarm(t, 1)
	if l := logs.String(); !strings.Contains(l, "lacks interpreters") || !strings.Contains(l, "javascript (node)") {
		t.Errorf("no start-up warning naming javascript (node):\n%s", l)
	}
	for _, l := range a.status(t).GetLanguages() {
		if (l.GetName() == "javascript") != (l.GetVersion() == "") {
			t.Errorf("language %s has version %q", l.GetName(), l.GetVersion())
		}
	}
	_, err := a.client("connect").Execute(t.Context(), connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{Language: "javascript", Code: "console.log(1)"}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "node is not installed") {
		t.Errorf("a JavaScript run without node: %v, want failed_precondition naming node", err)
	}
	if r := a.exec(t, &executionv1.Execution{Language: "python", Code: "print(1)"}); r.GetStdout() != "1\n" {
		t.Errorf("python after the failed JavaScript run: %v", r)
	}
}

// TestImageRebuilt builds another image under the sandbox image's name
// while an agent serves: within seconds stateless runs find the new image's
// files (its warm sandboxes were replaced), the agent logs the change, and
// a session opened before it keeps its sandbox, its state and its files.
func TestImageRebuilt(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	image := "codemode-sandbox:" + randomName("test-rebuilt")
	const marker = "/etc/codemode-test-image"
	var ids []string
	t.Cleanup(func() { removeImages(image, ids...) }) // after the agent's end
	build := func(content string) { ids = append(ids, deriveImage(t, image, "echo "+content+" > "+marker)) }
	build("one")

	var logs testlog.Buffer
	cfg := testConfig("test-rebuilt")
	cfg.Image = image
	// Two warm and the session's: no room for a third that a busy pool
	// would start, from the new image, without being told.
	cfg.MinActive, cfg.MaxSandboxes, cfg.MaxSessions = 2, 3, 1
	cfg.MaxReuse = 1000
	cfg.Memory = 256 << 20
	a, err := serveAgent(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.stop() })
	a.waitWarm(t, 2)
	read := "print(open(" + fmt.Sprintf("%q", marker) + ").read().strip())"
	if r := a.exec(t, &executionv1.Execution{Language: "python", Code: read}); r.GetStdout() != "one\n" {
		t.Fatalf("before the rebuild: %v", r)
	}
	session := randomName("s")
	if r := a.exec(t, &executionv1.Execution{Language: "python", Code: "x = 42\n" + read, SessionId: session}); r.GetStdout() != "one\n" {
		t.Fatalf("the session before the rebuild: %v", r)
	}
	a.waitWarm(t, 2) // the session's sandbox replaced, from the old image

	build("two")
	// Runs spaced out, a few dozen at most: with MaxReuse 1000 no sandbox
	// is replaced for having served its most runs.
	deadline := time.Now().Add(30 * time.Second)
	for n := 1; ; n++ {
		r := a.exec(t, &executionv1.Execution{Language: "python", Code: read})
		if r.GetStdout() == "two\n" {
			t.Logf("run %d after the rebuild found the new image", n)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runs in 30 s after the rebuild found %q", n, r.GetStdout())
		}
		time.Sleep(500 * time.Millisecond)
	}
	if l := logs.String(); !strings.Contains(l, "sandbox image changed") {
		t.Errorf("no log of the change:\n%s", l)
	}
	if r := a.exec(t, &executionv1.Execution{Language: "python", Code: "print(x)\n" + read, SessionId: session}); r.GetStdout() != "42\none\n" {
		t.Errorf("the session after the rebuild: %v", r)
	}
}

// deriveImage commits, as image, the sandbox image changed by a shell
// script, and returns the new image's id. Remove it with removeImages once
// no container uses it.
func deriveImage(t *testing.T, image, script string) string {
	t.Helper()
	name := randomName("derive")
	// runc, not runsc: this only edits a file system.
	if out, err := exec.Command("docker", "run", "--name", name, "--network", "none", "--runtime", "runc", "--entrypoint", "sh",
		DefaultConfig().Image, "-c", script).CombinedOutput(); err != nil {
		t.Fatalf("derive an image (%s): %v\n%s", script, err, out)
	}
	defer exec.Command("docker", "rm", "-f", name).Run()
	out, err := exec.Command("docker", "commit", name, image).CombinedOutput()
	if err != nil {
		t.Fatalf("docker commit: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// startOnDerivedImage serves an agent named after prefix, configured by
// edit, on an image derived from the sandbox image by script (see
// deriveImage), removed once the agent has ended; the agent logs into the
// returned buffer.
func startOnDerivedImage(t *testing.T, prefix, script string, edit func(*Config)) (*testAgent, *testlog.Buffer) {
	t.Helper()
	dockertest.Need(t)
	image := "codemode-sandbox:" + randomName(prefix)
	id := deriveImage(t, image, script)
	t.Cleanup(func() { removeImages(image, id) })
	logs := &testlog.Buffer{}
	cfg := testConfig(prefix)
	cfg.Image = image
	edit(&cfg)
	a, err := serveAgent(cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.stop() })
	return a, logs
}

// waitWarmLogged is waitWarm for the agents of startOnDerivedImage, whose
// sandboxes each import a preloaded parent's modules: on a host loaded by
// the package's other tests that can take minutes, so it waits longer, and
// a failure shows the pool and the tail of the agent's log (a start that
// failed, and why).
func waitWarmLogged(t *testing.T, a *testAgent, n int, logs *testlog.Buffer) {
	t.Helper()
	if !testkit.Until(4*time.Minute, func() bool { return a.pool.Stats().Warm >= n }) {
		t.Fatalf("after 4m: pool %+v, want %d warm\nagent log (tail):\n%s", a.pool.Stats(), n, testlog.Tail(logs.String(), 8<<10))
	}
}

// removeImages removes an image name and image ids.
func removeImages(name string, ids ...string) {
	exec.Command("docker", append([]string{"rmi", "-f", name}, ids...)...).Run()
}

// TestImageWithoutAPreloadedModule runs a preloading agent on an image
// derived from the sandbox image with scipy removed: it warns once, naming
// scipy, and lists the other default modules as preloaded, not scipy, so
// that MCP's description promises nothing the image lacks; runs import the
// rest as before.
func TestImageWithoutAPreloadedModule(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	a, logs := startOnDerivedImage(t, "test-no-scipy", "rm -rf /usr/lib/python3/dist-packages/scipy", func(c *Config) {
		c.Preload = "default"
		c.MinActive, c.MaxSandboxes, c.MaxSessions = 2, 2, 0
	})
	waitWarmLogged(t, a, 2, logs)
	if n := strings.Count(logs.String(), "lacks modules to preload"); n != 1 || !strings.Contains(logs.String(), "missing=[scipy]") {
		t.Errorf("%d warnings about modules to preload, want one naming scipy:\n%s", n, logs.String())
	}
	want := slices.DeleteFunc(languages.PreloadList("default"), func(m string) bool { return m == "scipy" })
	for _, l := range a.status(t).GetLanguages() {
		if l.GetName() == "python" && !slices.Equal(l.GetPreloaded(), want) {
			t.Errorf("python preloaded %q, want %q", l.GetPreloaded(), want)
		}
	}
	r := a.exec(t, &executionv1.Execution{Language: "python", Code: "import numpy, pandas\ntry:\n    import scipy\nexcept ImportError:\n    print('no scipy')\nprint(numpy.zeros(2).sum())"})
	if r.GetStdout() != "no scipy\n0.0\n" {
		t.Errorf("a run: %v", r)
	}
}

// TestImageWithoutNumpy runs a preloading agent on images derived from the
// sandbox image without numpy, and with a broken one (its pure-Python part
// removed: numpy imports as a bare namespace package, without
// numpy.random). pandas, matplotlib and scipy, which need numpy, fail to
// import in the parent. Without numpy the light parent holds requests
// alone, and runs naming numpy are forked from the parent; with the broken
// one its children find no numpy.random to reseed. Either way runs are
// forked.
func TestImageWithoutNumpy(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	for _, tc := range []struct{ name, script, want string }{
		{"absent", "rm -rf /usr/lib/python3/dist-packages/numpy /usr/lib/python3.11/dist-packages/numpy", "no numpy True\n"},
		{"broken", "rm -rf /usr/lib/python3/dist-packages/numpy", "False True\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			a, logs := startOnDerivedImage(t, "test-no-numpy", tc.script, func(c *Config) {
				c.Preload = "default"
				c.MinActive, c.MaxSandboxes, c.MaxSessions = 1, 1, 0
			})
			waitWarmLogged(t, a, 1, logs)
			for range 2 {
				r := a.exec(t, &executionv1.Execution{Language: "python", Code: "import os, requests\nprint(os.getppid() != 1)"})
				if r.GetStdout() != "True\n" {
					t.Errorf("a run importing requests, forked: %v", r)
				}
				r = a.exec(t, &executionv1.Execution{Language: "python", Code: "import os\ntry:\n    import numpy\n    print(hasattr(numpy, 'ndarray'), os.getppid() != 1)\nexcept ImportError:\n    print('no numpy', os.getppid() != 1)"})
				if r.GetStdout() != tc.want {
					t.Errorf("a run importing numpy: %v, want stdout %q", r, tc.want)
				}
			}
		})
	}
}

// TestRunnerLogsAtDebug runs an agent that logs at debug level: its runners
// then log at debug too, and each run's split of its time (see runOnce)
// reaches the agent's log.
func TestRunnerLogsAtDebug(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	var logs testlog.Buffer
	cfg := testConfig("test-debug")
	cfg.MinActive, cfg.MaxSandboxes, cfg.MaxSessions = 1, 1, 0
	cfg.Memory = 256 << 20
	a, err := serveAgent(cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.stop() })
	a.waitWarm(t, 1)
	res, err := a.client("connect").Execute(t.Context(), connect.NewRequest(&agentv1.ExecuteRequest{Execution: &executionv1.Execution{Language: "python", Code: "print(1)"}}))
	if err != nil || res.Msg.GetResult().GetStdout() != "1\n" {
		t.Fatalf("Execute: %v, %v", res, err)
	}
	testkit.Eventually(t, 10*time.Second, func() error {
		if !strings.Contains(logs.String(), `msg=run component=runner lang=python interpreter=prestarted`) {
			return fmt.Errorf("no debug line of the runner about the run in the agent's log:\n%s", logs.String())
		}
		return nil
	})
}
