package sandbox

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docker/docker/client"

	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// testDocker returns a driver for the local engine, or skips the test when no
// engine is reachable or it lacks the sandbox image.
func testDocker(t *testing.T) *Docker {
	t.Helper()
	d, err := NewDocker("", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	dockertest.Require(t, d.Client())
	return d
}

func testSpec(t *testing.T, command ...string) Spec {
	return Spec{
		Image:       dockertest.Image(),
		Runtime:     "runsc",
		Command:     command,
		User:        "65534:65534",
		MemoryBytes: 128 << 20,
		NanoCPUs:    500_000_000,
		PidsLimit:   256,
		Tmpfs: map[string]string{
			"/workspace": "rw,size=8m,mode=0755,uid=65534,gid=65534",
			"/tmp":       "rw,size=4m,mode=1777",
		},
		ShmBytes: 4 << 20,
		Labels:   map[string]string{LabelAgent: "test-sandbox-" + strings.ToLower(t.Name())[:4]},
	}
}

// TestDockerContainer starts a real runsc container whose entry process
// reports what it sees and then echoes its standard input, and checks the
// hardening from both sides: the engine's configuration and the view inside.
func TestDockerContainer(t *testing.T) {
	t.Parallel()
	d := testDocker(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	const script = `
echo "uid=$(id -u)"
echo "net=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ,)"
echo "capeff=$(grep CapEff /proc/self/status | cut -f2)"
if touch /rootfs-probe 2>/dev/null; then echo root=writable; else echo root=readonly; fi
if echo x > /workspace/probe; then echo workspace=writable; fi
echo "nnp=$(grep NoNewPrivs /proc/self/status | cut -f2)"
echo to-stderr >&2
echo ready
read -r line
echo "$line"
exit 3`
	spec := testSpec(t, "/bin/sh", "-c", script)
	spec.CPUShares = 128
	var (
		mu     sync.Mutex
		stderr []string
	)
	spec.Stderr = func(line []byte) {
		mu.Lock()
		stderr = append(stderr, string(line))
		mu.Unlock()
	}
	c, err := d.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Remove(context.Background()) })

	out := bufio.NewReader(c.Stdout())
	readFacts(t, ctx, c, out, &mu, &stderr)

	st, err := c.Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Running || st.Runtime != "runsc" || st.CPUShares != 128 {
		t.Errorf("state = %+v, want running under runsc with CPU shares 128", st)
	}
	// Its CPU weight changes while it runs.
	if err := c.SetCPUShares(ctx, 1024); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Inspect(ctx); err != nil || st.CPUShares != 1024 {
		t.Errorf("CPU shares after SetCPUShares(1024) = %d, %v", st.CPUShares, err)
	}
	// The attach stream carries standard input to the entry process and its
	// output back; the process then exits with status 3.
	if _, err := io.WriteString(c.Stdin(), "ping\n"); err != nil {
		t.Fatal(err)
	}
	line, err := out.ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("echo = %q, %v; want ping", line, err)
	}

	checkHostConfig(t, ctx, d, c.ID())

	// The entry process has exited: the stream ends.
	if _, err := io.ReadAll(out); err != nil {
		t.Errorf("stdout after exit: %v", err)
	}
	st, err = c.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Running || st.ExitCode != 3 {
		t.Errorf("state after stdin closed = %+v", st)
	}
	mu.Lock()
	if !slices.Contains(stderr, "to-stderr") {
		t.Errorf("stderr lines %q, want to-stderr", stderr)
	}
	mu.Unlock()

	if err := c.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Client().ContainerInspect(ctx, c.ID()); !client.IsErrNotFound(err) {
		t.Errorf("inspect after remove: %v, want not found", err)
	}
}

// readFacts reads what the script found inside the sandbox, up to "ready",
// and checks it: nobody, only loopback, no capabilities, a read-only root,
// a writable workspace, no new privileges.
func readFacts(t *testing.T, ctx context.Context, c Container, out *bufio.Reader, mu *sync.Mutex, stderr *[]string) {
	facts := map[string]string{}
	for {
		line, err := out.ReadString('\n')
		if err != nil {
			st, _ := c.Wait(ctx)
			mu.Lock()
			t.Fatalf("read facts: %v (so far %v); state %+v; stderr %q", err, facts, st, *stderr)
		}
		line = strings.TrimSpace(line)
		if line == "ready" {
			break
		}
		k, v, _ := strings.Cut(line, "=")
		facts[k] = v
	}
	want := map[string]string{
		"uid":       "65534",
		"net":       "lo,",
		"capeff":    "0000000000000000",
		"root":      "readonly",
		"workspace": "writable",
		"nnp":       "1",
	}
	for k, v := range want {
		if facts[k] != v {
			t.Errorf("inside the sandbox %s = %q, want %q", k, facts[k], v)
		}
	}
}

// checkHostConfig checks what Docker was told for container id: runsc, no
// network, a read-only root, no capabilities, no new privileges, the limits and the label.
func checkHostConfig(t *testing.T, ctx context.Context, d *Docker, id string) {
	info, err := d.Client().ContainerInspect(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	hc := info.HostConfig
	switch {
	case hc.Runtime != "runsc":
		t.Errorf("runtime %q", hc.Runtime)
	case hc.NetworkMode != "none":
		t.Errorf("network mode %q", hc.NetworkMode)
	case !hc.ReadonlyRootfs:
		t.Error("root file system is writable")
	case !slices.Equal([]string(hc.CapDrop), []string{"ALL"}):
		t.Errorf("cap drop %v", hc.CapDrop)
	case !slices.Contains(hc.SecurityOpt, "no-new-privileges"):
		t.Errorf("security options %v", hc.SecurityOpt)
	case hc.Memory != 128<<20 || hc.MemorySwap != 128<<20:
		t.Errorf("memory %d swap %d", hc.Memory, hc.MemorySwap)
	case hc.PidsLimit == nil || *hc.PidsLimit != 256:
		t.Errorf("pids limit %v", hc.PidsLimit)
	case hc.NanoCPUs != 500_000_000:
		t.Errorf("cpus %d", hc.NanoCPUs)
	case !strings.Contains(hc.Tmpfs["/workspace"], "size=8m"):
		t.Errorf("tmpfs %v", hc.Tmpfs)
	case info.Config.Labels[LabelSandbox] != "1":
		t.Errorf("labels %v", info.Config.Labels)
	}
}

// TestDockerRemoveAll reaps containers by label and keeps the ones asked for.
func TestDockerRemoveAll(t *testing.T) {
	t.Parallel()
	d := testDocker(t)
	ctx := t.Context()
	spec := testSpec(t, "/bin/sleep", "600")
	spec.Labels = map[string]string{LabelAgent: "test-removeall-" + randomHex(4)}
	var ids []string
	for range 2 {
		c, err := d.Start(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Remove(context.Background()) })
		ids = append(ids, c.ID())
	}
	n, err := d.RemoveAll(ctx, spec.Labels, map[string]bool{ids[1]: true})
	if err != nil || n != 1 {
		t.Fatalf("RemoveAll = %d, %v; want 1", n, err)
	}
	if _, err := d.Client().ContainerInspect(ctx, ids[0]); !client.IsErrNotFound(err) {
		t.Errorf("reaped container still there: %v", err)
	}
	if _, err := d.Client().ContainerInspect(ctx, ids[1]); err != nil {
		t.Errorf("kept container: %v", err)
	}
}

// TestDockerUnavailable shows that an engine that cannot be reached is
// reported as ErrUnavailable.
func TestDockerUnavailable(t *testing.T) {
	t.Parallel()
	d, err := NewDocker("unix://"+t.TempDir()+"/no.sock", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Ping(t.Context()); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Ping = %v, want ErrUnavailable", err)
	}
	_, err = d.Start(t.Context(), testSpec(t, "/bin/true"))
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("Start = %v, want ErrUnavailable", err)
	}
}
