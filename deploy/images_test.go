package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// `make images` builds the edge's and the control plane's images with the
// local engine; each runs as a user without privileges on a read-only root
// file system, with no network, answers --version, and its health check
// (the binary asking itself) reports it healthy.
func TestImages(t *testing.T) {
	dockertest.Need(t)
	tag := fmt.Sprintf("test-%d", os.Getpid())
	cmd := exec.Command("bash", "images/images.sh")
	cmd.Env = append(os.Environ(), "IMAGE_TAG="+tag, "VERSION=v0.0.0-imagetest")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("images.sh: %v\n%s", err, out)
	}
	docker := func(args ...string) (string, error) {
		out, err := exec.Command("docker", args...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	for _, tc := range []struct {
		svc  string
		args []string
	}{
		{"edge", []string{"--addr", "127.0.0.1:8000"}},
		{"controlplane", []string{"--addr", "127.0.0.1:8080", "--agents="}},
	} {
		t.Run(tc.svc, func(t *testing.T) {
			image := "codemode-" + tc.svc + ":" + tag
			t.Cleanup(func() { _, _ = docker("rmi", "-f", image) })
			if user, err := docker("image", "inspect", "-f", "{{.Config.User}}", image); err != nil || user != "65532:65532" {
				t.Errorf("image user %q %v, want 65532:65532", user, err)
			}
			if out, err := docker("run", "--rm", "--network=none", image, "--version"); err != nil || !strings.HasPrefix(out, tc.svc+" v0.0.0-imagetest (commit ") {
				t.Errorf("--version: %q %v", out, err)
			}
			name := fmt.Sprintf("codemode-image-test-%s-%d", tc.svc, os.Getpid())
			args := append([]string{"run", "-d", "--name", name, "--read-only", "--network=none", "--cap-drop=ALL",
				"--security-opt=no-new-privileges", "--health-interval=1s", image}, tc.args...)
			if out, err := docker(args...); err != nil {
				t.Fatalf("run: %v\n%s", err, out)
			}
			t.Cleanup(func() { _, _ = docker("rm", "-f", name) })
			var status string
			testkit.WaitFor(t, 60*time.Second, "healthy", func() bool {
				status, _ = docker("inspect", "-f", "{{.State.Health.Status}}", name)
				return status == "healthy"
			})
			if t.Failed() {
				logs, _ := docker("logs", name)
				t.Logf("health %s; logs:\n%s", status, logs)
			}
		})
	}
}
