package agentd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/codemode-go/codemode/agent/internal/sandbox"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// The tests run real agents against the local Docker Engine with runsc.
// TestMain builds the runner once; without an engine (or without the
// sandbox image) every such test is skipped with the reason.
var (
	runnerBin string // path of the runner built for the tests
)

func TestMain(m *testing.M) {
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "agentd-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	err = dockertest.Check(ctx)
	cancel()
	if err == nil {
		runnerBin = filepath.Join(dir, "runner")
		cmd := exec.Command("go", "build", "-trimpath", "-o", runnerBin, "github.com/codemode-go/codemode/agent/cmd/runner")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build runner: %v\n%s", err, out)
			return 1
		}
		reapStaleTestSandboxes()
	}
	code := m.Run()
	stopShared()
	return code
}

// reapStaleTestSandboxes removes sandboxes of test agents (names starting
// "test-") that an earlier, killed test run left behind. Only old ones:
// other test processes may be running now.
func reapStaleTestSandboxes() {
	d, err := sandbox.NewDocker("", slog.New(slog.DiscardHandler))
	if err != nil {
		return
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	list, err := d.Client().ContainerList(ctx, container.ListOptions{All: true, Filters: filters.NewArgs(filters.Arg("label", sandbox.LabelSandbox+"=1"))})
	if err != nil {
		return
	}
	for _, c := range list {
		if strings.HasPrefix(c.Labels[sandbox.LabelAgent], "test-") && time.Since(time.Unix(c.Created, 0)) > 15*time.Minute {
			_ = d.Client().ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
		}
	}
}

func randomName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// testAgent is an agent served in process on a loopback port.
type testAgent struct {
	*Agent
	URL  string
	stop func() error // stops serving and removes the sandboxes
}

// testConfig is the default configuration of an agent named after prefix,
// with the runner built for the tests and no preloading.
//
// Preloading is off unless a test turns it on: the tests here are about
// everything else, and some need it off. Beside a parent,
// TestStatelessIsolation's run B sees one python3 it did not start (the
// parent, whose /proc entry gVisor gives the user), and TestAbuse's disk
// fill (80 MiB of tmpfs) meets the memory watchdog in 256 MiB sandboxes, of
// which the parent holds ~110. And each parent's imports cost seconds of CPU
// that a host running the other packages beside this one does not have: a
// run waiting for a first sandbox still importing them outlasted its queue
// timeout there. The preloaded parent's own isolation and abuse tests are
// the runner's (TestPreloadIsolation, TestPreloadAbuse) and
// preload_test.go's; the defaults end to end are TestMakeUp's "preloaded".
func testConfig(prefix string) Config {
	cfg := DefaultConfig()
	cfg.Name = randomName(prefix)
	cfg.Runner = runnerBin
	cfg.Preload = ""
	return cfg
}

// startAgent starts an agent with cfg adjusted by edit, served on
// 127.0.0.1:0.
func startAgent(t testing.TB, edit func(*Config)) *testAgent {
	t.Helper()
	dockertest.Need(t)
	cfg := testConfig("test-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))[:min(len(t.Name()), 12)])
	cfg.MinActive = 1
	cfg.MaxSandboxes = 4
	cfg.MaxSessions = 2
	cfg.Memory = 256 << 20
	cfg.LogLevel = "debug"
	if edit != nil {
		edit(&cfg)
	}
	ta, err := serveAgent(cfg, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ta.stop(); err != nil {
			t.Errorf("stop agent: %v", err)
		}
	})
	return ta
}

func serveAgent(cfg Config, logger *slog.Logger) (*testAgent, error) {
	ctx, cancel := context.WithCancel(context.Background())
	a, err := New(ctx, cfg, logger)
	if err != nil {
		cancel()
		return nil, err
	}
	ln, err := server.Listen(ctx, "127.0.0.1:0")
	if err != nil {
		cancel()
		a.Close(context.Background())
		return nil, err
	}
	errc := make(chan error, 1)
	go func() { errc <- a.Serve(ctx, ln) }()
	var once sync.Once
	var stopErr error
	return &testAgent{Agent: a, URL: "http://" + ln.Addr().String(), stop: func() error {
		once.Do(func() {
			cancel()
			stopErr = <-errc
		})
		return stopErr
	}}, nil
}

// waitWarm waits until the agent has n warm sandboxes.
func (a *testAgent) waitWarm(t testing.TB, n int) {
	t.Helper()
	testkit.Eventually(t, 2*time.Minute, func() error {
		if w := a.pool.Stats().Warm; w < n {
			return fmt.Errorf("agent has %d warm sandboxes, want %d", w, n)
		}
		return nil
	})
}

// client returns an AgentService client over real HTTP/2 speaking protocol
// ("grpc", "grpcweb", "connect" or "connect+json").
func (a *testAgent) client(protocol string) agentv1connect.AgentServiceClient {
	var opts []connect.ClientOption
	switch protocol {
	case "grpc":
		opts = append(opts, connect.WithGRPC())
	case "grpcweb":
		opts = append(opts, connect.WithGRPCWeb())
	case "connect+json":
		opts = append(opts, connect.WithProtoJSON())
	}
	return agentv1connect.NewAgentServiceClient(server.NewClient(), a.URL, opts...)
}

// exec runs code through the Connect API and fails the test on an RPC
// error.
func (a *testAgent) exec(t testing.TB, e *executionv1.Execution) *executionv1.Result {
	t.Helper()
	res, err := a.client("connect").Execute(context.Background(), connect.NewRequest(&agentv1.ExecuteRequest{Execution: e, AllowNewSession: true}))
	if err != nil {
		t.Fatalf("Execute(%.60q): %v", e.GetCode(), err)
	}
	return res.Msg.GetResult()
}

// Shared agent, for tests that need no agent of their own.
var (
	sharedOnce  sync.Once
	sharedAgent *testAgent
	sharedErr   error
)

func shared(t testing.TB) *testAgent {
	t.Helper()
	dockertest.Need(t)
	sharedOnce.Do(func() {
		cfg := testConfig("test-shared")
		cfg.MinActive = 2
		cfg.MaxSandboxes = 12
		cfg.MaxSessions = 8
		cfg.MaxSessionsPerTenant = 8 // the tests share one tenant
		cfg.Memory = 256 << 20
		cfg.SessionIdleTTL = time.Minute
		sharedAgent, sharedErr = serveAgent(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	})
	if sharedErr != nil {
		t.Fatal(sharedErr)
	}
	return sharedAgent
}

func stopShared() {
	if sharedAgent != nil {
		if err := sharedAgent.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop shared agent:", err)
		}
	}
}
