package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"connectrpc.com/connect"

	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
	"github.com/codemode-go/codemode/internal/testkit/redistest"
)

// BenchmarkExecuteRedis measures what keeping sessions in Redis costs a
// run: Execute of print(1) through a control plane with --redis-url and
// through one without, both in front of the same agent, in turns in the
// same run (pairedLatency), stateless and in a session. A stateless run
// does not touch Redis; a session run reads its binding once.
//
//	go test -run '^$' -bench ExecuteRedis -benchtime 100x -count 3 ./edge/e2e/
func BenchmarkExecuteRedis(b *testing.B) {
	dockertest.Need(b)
	rds := redistest.Start(b)
	secret := newSecret()
	env := []string{"CODEMODE_CLUSTER_SECRET=" + secret}
	state, err := os.MkdirTemp(binDir, "agent-state-")
	if err != nil {
		b.Fatal(err)
	}
	agent, err := start("agent", env, "--addr", "127.0.0.1:0", "--name", fmt.Sprintf("e2e-bench-redis-%d", os.Getpid()),
		"--runner", filepath.Join(binDir, "runner"), "--state-dir", state, "--min-active", "2")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = agent.Stop(30 * time.Second) })
	clients := map[string]controlplanev1connect.ControlPlaneServiceClient{}
	for _, name := range []string{"redis", "memory"} {
		cpEnv := append(slices.Clip(env), "REMOTE_HOSTS="+agent.Addr)
		if name == "redis" {
			cpEnv = append(cpEnv, "REDIS_URL="+rds.URL) // holds the password: not on the command line
		}
		cp, err := start("controlplane", cpEnv, "--addr", "127.0.0.1:0", "--poll-interval", "200ms")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cp.Stop(10 * time.Second) })
		c := server.NewClient()
		c.Transport = bearerTransport{secret: secret, base: c.Transport}
		clients[name] = controlplanev1connect.NewControlPlaneServiceClient(c, cp.URL())
	}
	ctx := context.Background()
	run := func(name, session string) pair {
		return pair{name: name, run: func() {
			res, err := clients[name].Execute(ctx, connect.NewRequest(&cpv1.ExecuteRequest{Tenant: "bench",
				Execution: &executionv1.Execution{Language: "python", Code: "print(1)", SessionId: session}}))
			if err != nil || res.Msg.GetResult().GetStdout() != "1\n" {
				b.Fatalf("%s: %v %v", name, res, err)
			}
		}}
	}
	// Wait until both route to the agent.
	testkit.Eventually(b, 2*time.Minute, func() error {
		for _, name := range []string{"redis", "memory"} {
			res, err := clients[name].ListAgents(ctx, connect.NewRequest(&cpv1.ListAgentsRequest{}))
			if err != nil || len(res.Msg.GetAgents()) != 1 || !res.Msg.GetAgents()[0].GetHealthy() {
				return fmt.Errorf("%s: agent not healthy: %v %v", name, res, err)
			}
		}
		return nil
	})
	b.Run("stateless", func(b *testing.B) {
		pairedLatency(b, run("redis", ""), run("memory", ""))
	})
	b.Run("session", func(b *testing.B) {
		pairedLatency(b, run("redis", "bench-redis"), run("memory", "bench-memory"))
	})
}
