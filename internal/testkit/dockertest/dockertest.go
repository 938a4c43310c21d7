// Package dockertest finds, for tests that run real containers, the local
// Docker Engine and the sandbox image, and skips a test where either is
// missing. agent/host/setup.sh installs both.
package dockertest

import (
	"context"
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
