package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
	"github.com/codemode-go/codemode/internal/testkit/launch"
)

// binDir holds the binaries built once for the whole test run.
var binDir string

// shared is the stack most tests use, started on first use.
var (
	sharedOnce  sync.Once
	sharedStack *Stack
	sharedErr   error
)

func TestMain(m *testing.M) {
	code := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := dockertest.Check(ctx)
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
			return m.Run() // tests that need it skip, or fail in CI (dockertest.Need)
		}
		dir, err := os.MkdirTemp("", "codemode-e2e-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binDir = dir
		if err := build(dir); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: build:", err)
			return 1
		}
		code := m.Run()
		if sharedStack != nil {
			sharedStack.Stop()
		}
		return code
	}()
	os.Exit(code)
}

func moduleRoot() string {
	dir, err := testkit.ModuleRoot()
	if err != nil {
		panic(err)
	}
	return dir
}

// build compiles the three services and the in-sandbox runner into dir,
// with -trimpath: what it builds does not depend on where the repository
// is, so that a clone elsewhere finds it in the build cache.
func build(dir string, flags ...string) error {
	args := append(append([]string{"build", "-trimpath", "-o", dir + "/"}, flags...), "./edge/cmd/edge", "./controlplane/cmd/controlplane", "./agent/cmd/agent", "./agent/cmd/runner")
	cmd := exec.Command("go", args...)
	cmd.Dir = moduleRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return nil
}

// buildTool compiles pkg, a tool that go.mod pins, into binDir and
// returns the binary's path.
func buildTool(t *testing.T, pkg string) string {
	t.Helper()
	bin := filepath.Join(binDir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Dir = moduleRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// Process is one running binary.
type Process = launch.Process

// start runs binary name with args, JSON logs, and waits until it logs the
// address it listens on.
func start(name string, env []string, args ...string) (*Process, error) {
	cmd := exec.Command(filepath.Join(binDir, name), append(args, "--log-format=json", "--log-level=debug")...)
	cmd.Env = append(os.Environ(), env...)
	if filepath.Base(name) == "agent" {
		cmd.Env = append([]string{agentPreload}, cmd.Env...)
	}
	return launch.Start(context.Background(), cmd, launch.Options{Name: name, ListenTimeout: 2 * time.Minute})
}

// agentPreload is what the agents started by start preload, unless a test
// says otherwise (--preload, or PRELOAD in env): nothing. A preloaded
// parent costs every new sandbox seconds of CPU under gVisor (the default
// list 4-7 s, requests alone about one), and this package's stacks start
// many sandboxes on a host of two CPUs: with the default list their
// sandboxes took half of the host's CPU over a run of the package.
// Preloading through the whole stack, with the
// default list as make up runs it, is TestMakeUp's "preloaded"; code
// mode's requests forked from a parent is TestCodeModeAPIs's; the
// parent's own claims are the runner's and the agent's tests.
const agentPreload = "PRELOAD=none"

// Stack is an agent, a control plane and an edge wired together, sharing a
// cluster secret.
type Stack struct {
	Agent, ControlPlane, Edge *Process
	AgentName                 string
	// Secret is the cluster secret of the stack's three services.
	Secret string
	// agentArgs are the agent's flags, kept to restart it the same way.
	agentArgs []string
}

// ClusterEnv is the environment that gives a process the stack's secret.
func (s *Stack) ClusterEnv() []string {
	return []string{"CODEMODE_CLUSTER_SECRET=" + s.Secret}
}

// StartEdge starts another edge in front of the stack's control plane,
// with the stack's secret and the given extra environment and flags.
func (s *Stack) StartEdge(env []string, args ...string) (*Process, error) {
	env = append(append(s.ClusterEnv(), "CODE_EXECUTION_HOST="+s.ControlPlane.URL()), env...)
	return start("edge", env, append([]string{"--addr", "127.0.0.1:0"}, args...)...)
}

// newSecret returns a random cluster secret.
func newSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// StartStack starts a stack whose agent has the given name (with this
// process's id added, so that test runs side by side never remove each
// other's sandboxes) and extra flags.
func StartStack(agentName string, agentArgs ...string) (*Stack, error) {
	return startStackOf("", agentName, agentArgs...)
}

// startStackOf is StartStack with the agent and runner built into the
// subdirectory bins of binDir ("": binDir itself).
func startStackOf(bins, agentName string, agentArgs ...string) (*Stack, error) {
	return startStackEnv(bins, nil, agentName, agentArgs...)
}

// startStackEnv is startStackOf with env added to the environment of the
// agent, the control plane and the edge.
func startStackEnv(bins string, env []string, agentName string, agentArgs ...string) (*Stack, error) {
	agentName = fmt.Sprintf("%s-%d", agentName, os.Getpid())
	s := &Stack{AgentName: agentName, Secret: newSecret()}
	state, err := os.MkdirTemp(binDir, "agent-state-")
	if err != nil {
		return nil, err
	}
	s.agentArgs = append([]string{"--name", agentName, "--runner", filepath.Join(binDir, bins, "runner"), "--state-dir", state}, agentArgs...)
	s.Agent, err = start(filepath.Join(bins, "agent"), append(s.ClusterEnv(), env...), append([]string{"--addr", "127.0.0.1:0"}, s.agentArgs...)...)
	if err != nil {
		return nil, err
	}
	s.ControlPlane, err = start("controlplane", append(append(s.ClusterEnv(), "REMOTE_HOSTS="+s.Agent.Addr), env...), "--addr", "127.0.0.1:0", "--poll-interval", "200ms")
	if err != nil {
		s.Stop()
		return nil, err
	}
	s.Edge, err = s.StartEdge(env)
	if err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.waitAgentHealthy(2 * time.Minute); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// waitAgentHealthy waits until the control plane reports the agent ready.
func (s *Stack) waitAgentHealthy(timeout time.Duration) error {
	cp := s.ControlPlaneClient()
	return testkit.Poll(timeout, func() error {
		res, err := cp.ListAgents(context.Background(), connect.NewRequest(&cpv1.ListAgentsRequest{}))
		if err == nil && len(res.Msg.GetAgents()) > 0 && res.Msg.GetAgents()[0].GetHealthy() {
			return nil
		}
		return fmt.Errorf("agent not healthy after %s (last: %v %v)\nagent logs:\n%s", timeout, res, err, s.Agent.Logs())
	})
}

// ControlPlaneClient is a client of the stack's control plane that sends the
// cluster secret.
func (s *Stack) ControlPlaneClient() controlplanev1connect.ControlPlaneServiceClient {
	c := server.NewClient()
	c.Transport = bearerTransport{secret: s.Secret, base: c.Transport}
	return controlplanev1connect.NewControlPlaneServiceClient(c, s.ControlPlane.URL())
}

// bearerTransport sends a bearer token with every request.
type bearerTransport struct {
	secret string
	base   http.RoundTripper
}

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.secret)
	return b.base.RoundTrip(r)
}

// Stop stops the edge, the control plane and the agent, in that order.
func (s *Stack) Stop() {
	for _, p := range []*Process{s.Edge, s.ControlPlane, s.Agent} {
		if p != nil {
			_ = p.Stop(30 * time.Second)
		}
	}
}

// Logs returns every process's logs, for failure messages.
func (s *Stack) Logs() string {
	var b strings.Builder
	for _, p := range []*Process{s.Agent, s.ControlPlane, s.Edge} {
		if p != nil {
			fmt.Fprintf(&b, "--- %s ---\n%s\n", p.Name, p.Logs())
		}
	}
	return b.String()
}

// shared returns the stack shared by most tests, or skips the test when
// there is no Docker daemon.
func shared(t *testing.T) *Stack {
	t.Helper()
	dockertest.Need(t)
	sharedOnce.Do(func() {
		// Tests side by side share its tenants: each may hold every session.
		sharedStack, sharedErr = StartStack("e2e-shared", "--min-active", "2", "--max-sessions-per-tenant", "8")
	})
	if sharedErr != nil {
		t.Fatalf("start stack: %v", sharedErr)
	}
	return sharedStack
}

// httpClient speaks HTTP/1.1 and h2c.
var httpClient = server.NewClient()
