// Package dockertest finds, for tests that run real containers, the local
// Docker Engine, its runsc runtime and the sandbox image, and ends a test
// where one is missing: a skip, or in CI a failure (see testenv.Missing).
// agent/host/setup.sh installs all three.
package dockertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/codemode-go/codemode/internal/limits"
	"github.com/codemode-go/codemode/internal/testkit/testenv"
)

// Image is the sandbox image tests run: $DOCKER_IMAGE_NAME, or else the
// one agent/host/setup.sh builds.
func Image() string {
	if img := os.Getenv("DOCKER_IMAGE_NAME"); img != "" {
		return img
	}
	return limits.SandboxImage
}

// Check reports why this host cannot run the sandbox tests: no Docker
// Engine answers, the engine has no runsc runtime, or it lacks [Image]. It
// returns nil when it can run them. A TestMain asks it before building what
// those tests need.
func Check(ctx context.Context) error {
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		return fmt.Errorf("no Docker Engine client (run agent/host/setup.sh as root first): %w", err)
	}
	defer cli.Close()
	info, err := cli.Info(ctx)
	if err != nil {
		return fmt.Errorf("no Docker Engine reachable (run agent/host/setup.sh as root first): %w", err)
	}
	if _, ok := info.Runtimes["runsc"]; !ok {
		return errors.New("the Docker Engine has no runsc runtime (run agent/host/setup.sh as root first)")
	}
	if _, err := cli.ImageInspect(ctx, Image()); err != nil {
		return fmt.Errorf("sandbox image %s missing (run agent/host/setup.sh as root first): %w", Image(), err)
	}
	return nil
}

// Need ends tb, as [testenv.Missing] does, unless [Check] passes: a skip,
// or in CI a failure.
func Need(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := Check(ctx); err != nil {
		testenv.Missing(tb, "%v", err)
	}
}

// Require skips t unless the engine of cli answers and holds [Image].
func Require(t testing.TB, cli *client.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := cli.Ping(ctx); err != nil {
		testenv.Missing(t, "no Docker Engine reachable (run agent/host/setup.sh as root first): %v", err)
	}
	if _, err := cli.ImageInspect(ctx, Image()); err != nil {
		testenv.Missing(t, "sandbox image %s missing (run agent/host/setup.sh as root first): %v", Image(), err)
	}
}

// Client returns a client of the local engine, configured from the
// environment and closed when t ends, once [Require] has passed.
func Client(t testing.TB) *client.Client {
	t.Helper()
	cli, err := client.NewClientWithOpts(client.FromEnv, client.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	Require(t, cli)
	return cli
}
