package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/codemode-go/codemode/internal/testkit/launch"
)

// Bounds of a service's life: how long it may take to listen, and to exit
// after SIGTERM (the agent then removes its sandboxes) before it is killed.
const (
	listenTimeout = 2 * time.Minute
	stopTimeout   = time.Minute
)

// start runs the binary name from b.dir with env and args and JSON logs,
// and waits until it logs the address it listens on. Warnings and errors
// of its log go to b.log.
func (b *bench) start(ctx context.Context, name string, env []string, args ...string) (*launch.Process, error) {
	cmd := exec.Command(filepath.Join(b.dir, name), append(args, "--log-format=json", "--log-level=info")...)
	cmd.Env = append(os.Environ(), env...)
	p, err := launch.Start(ctx, cmd, launch.Options{Name: name, ListenTimeout: listenTimeout, Watch: func(line string) {
		var rec struct{ Level string }
		if json.Unmarshal([]byte(line), &rec) == nil && (rec.Level == "WARN" || rec.Level == "ERROR") {
			fmt.Fprintf(b.log, "%s: %s\n", name, line)
		}
	}})
	if err != nil {
		return nil, err
	}
	b.procs = append(b.procs, p)
	return p, nil
}

// up builds the binaries and the example policies, and, for the doors'
// parts, starts an agent, a control plane in front of it, and two edges
// in front of that: one plain, one with the example policy chain. Both
// edges have one API key.
func (b *bench) up(ctx context.Context) error {
	var err error
	if b.dir, err = os.MkdirTemp("", "stackbench-"); err != nil {
		return err
	}
	b.logf("building the services and the runner")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", b.dir+"/",
		"./edge/cmd/edge", "./controlplane/cmd/controlplane", "./agent/cmd/agent", "./agent/cmd/runner")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stderr = b.log
	if err := build.Run(); err != nil {
		return fmt.Errorf("build (run from the repository root): %w", err)
	}
	policies := filepath.Join(b.dir, "policies")
	if b.o.doors() {
		b.logf("building the example policies")
		pb := exec.CommandContext(ctx, "bash", "policies/build.sh", policies)
		pb.Stdout, pb.Stderr = b.log, b.log
		if err := pb.Run(); err != nil {
			return fmt.Errorf("build policies: %w", err)
		}
	}

	var secret [32]byte
	_, _ = rand.Read(secret[:])
	b.secret = hex.EncodeToString(secret[:])
	_, _ = rand.Read(secret[:12])
	b.key = "k-bench-" + hex.EncodeToString(secret[:12])
	keys := filepath.Join(b.dir, "keys.json")
	kb, _ := json.Marshal(map[string]string{b.key: "bench"})
	if err := os.WriteFile(keys, kb, 0o600); err != nil {
		return err
	}
	env := []string{"CODEMODE_CLUSTER_SECRET=" + b.secret}

	b.name = fmt.Sprintf("stackbench-%d", os.Getpid())
	if !b.o.doors() {
		return nil // the workload and the TLS part start stacks of their own
	}
	if b.agent, err = b.start(ctx, "agent", env, b.agentArgs(b.name, "--preload=default")...); err != nil {
		return err
	}
	if b.cp, err = b.start(ctx, "controlplane", append(env, "REMOTE_HOSTS="+b.agent.Addr), "--addr", "127.0.0.1:0", "--poll-interval", "200ms"); err != nil {
		return err
	}
	edgeEnv := append(env, "CODE_EXECUTION_HOST="+b.cp.URL())
	if b.edge, err = b.start(ctx, "edge", edgeEnv, "--addr", "127.0.0.1:0", "--api-keys", keys); err != nil {
		return err
	}
	if b.o.doors() {
		if b.policyEdge, err = b.start(ctx, "edge", edgeEnv, "--addr", "127.0.0.1:0", "--api-keys", keys,
			"--policy-config", filepath.Join(policies, "policies.json")); err != nil {
			return err
		}
	}
	b.logf("waiting for the agent's %d warm sandboxes", b.o.warm)
	return b.waitReady(ctx, b.edge, b.agent)
}

// agentArgs are the arguments of an agent named name, with its own state
// directory: the bench's settings, then extra.
func (b *bench) agentArgs(name string, extra ...string) []string {
	return append([]string{"--addr", "127.0.0.1:0", "--name", name,
		"--runner", filepath.Join(b.dir, "runner"), "--state-dir", filepath.Join(b.dir, name+"-state"),
		"--min-active", strconv.Itoa(b.o.warm), "--queue-timeout", b.o.queue.String(),
		"--image", b.o.image, "--runtime", b.o.runtime, "--metrics-addr", "127.0.0.1:0"}, extra...)
}

// waitReady waits, at most five minutes, until edge's GET /status says
// an agent is ready to run (as `make up` does) and agent has its warm
// sandboxes.
func (b *bench) waitReady(ctx context.Context, edge, agent *launch.Process) error {
	deadline := time.Now().Add(5 * time.Minute)
	hc := b.authClient(b.key)
	for time.Now().Before(deadline) {
		if err := ctx.Err(); err != nil {
			return err
		}
		ok := func() bool {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, edge.URL()+"/status", nil)
			res, err := hc.Do(req)
			if err != nil {
				return false
			}
			res.Body.Close()
			return res.StatusCode == http.StatusOK
		}()
		if ok && b.agentWarm(ctx, agent) >= b.o.warm {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return errors.New("the stack was not ready within 5 minutes")
}
