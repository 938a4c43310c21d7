package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/mount"
	"github.com/docker/docker/client"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/codemode-go/codemode/internal/cpuset"
)

var _ Driver = (*Docker)(nil)

// Docker is a Driver that talks to a Docker Engine through its API, with API
// version negotiation (Engine 20.10 speaks API 1.41).
type Docker struct {
	cli    *client.Client
	logger *slog.Logger
}

// NewDocker returns a driver for the engine at host ("unix:///var/run/docker.sock",
// ...). An empty host means the DOCKER_HOST environment variable, then the
// default socket. It does not contact the engine.
func NewDocker(host string, logger *slog.Logger) (*Docker, error) {
	opts := []client.Opt{client.FromEnv, client.WithAPIVersionNegotiation()}
	if host != "" {
		opts = append(opts, client.WithHost(host))
	}
	cli, err := client.NewClientWithOpts(opts...)
	if err != nil {
		return nil, fmt.Errorf("create docker client: %w", err)
	}
	return &Docker{cli: cli, logger: logger}, nil
}

// Client returns the underlying Engine API client, for callers that need more
// than a Driver (benchmarks, tests that inspect containers).
func (d *Docker) Client() *client.Client { return d.cli }

// Close closes the client's idle connections.
func (d *Docker) Close() error { return d.cli.Close() }

// Ping reports whether the engine answers.
func (d *Docker) Ping(ctx context.Context) error {
	if _, err := d.cli.Ping(ctx); err != nil {
		return fmt.Errorf("ping docker: %w", classify(err))
	}
	return nil
}

// PrepareCPUSets readies the engine's cgroups for sandboxes pinned to CPUs
// (see cpuset.PrepareEngine). It works on this host's cgroups, so the
// engine must run on this host.
func (d *Docker) PrepareCPUSets(ctx context.Context) error {
	info, err := d.cli.Info(ctx)
	if err != nil {
		return fmt.Errorf("read the Docker Engine's cgroup set-up: %w", classify(err))
	}
	return cpuset.PrepareEngine(info.CgroupVersion, info.CgroupDriver)
}

// HasImage reports whether image is present locally. Drivers never pull.
func (d *Docker) HasImage(ctx context.Context, image string) (bool, error) {
	if _, err := d.cli.ImageInspect(ctx, image); err != nil {
		if client.IsErrNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("inspect image %s: %w", image, classify(err))
	}
	return true, nil
}

// ImageID returns the id of the image that image names now.
func (d *Docker) ImageID(ctx context.Context, image string) (string, error) {
	info, err := d.cli.ImageInspect(ctx, image)
	if err != nil {
		return "", fmt.Errorf("inspect image %s: %w", image, classify(err))
	}
	return info.ID, nil
}

// Start creates, attaches to and starts a container from spec.
func (d *Docker) Start(ctx context.Context, spec Spec) (Container, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	cfg, hcfg := d.config(&spec)
	name := "codemode-" + randomHex(6)
	created, err := d.cli.ContainerCreate(ctx, cfg, hcfg, nil, nil, name)
	if err != nil {
		err = fmt.Errorf("create container: %w", classify(err))
		if ctx.Err() != nil {
			// The engine may have created it after all: remove it by name.
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if rerr := d.cli.ContainerRemove(rctx, name, container.RemoveOptions{Force: true}); rerr != nil && !client.IsErrNotFound(rerr) {
				err = errors.Join(err, fmt.Errorf("remove container %s: %w", name, classify(rerr)))
			}
			cancel()
		}
		return nil, err
	}
	c := &dockerContainer{d: d, id: created.ID}
	// The image it was created from, whatever spec.Image names by now.
	info, err := d.cli.ContainerInspect(ctx, c.id)
	if err != nil {
		err = fmt.Errorf("inspect container %s: %w", ShortID(c.id), classify(err))
		return nil, errors.Join(err, c.remove())
	}
	c.image = info.Image
	// Attach before starting, so that nothing the entry process writes first
	// is lost.
	hj, err := d.cli.ContainerAttach(ctx, c.id, container.AttachOptions{
		Stream: true, Stdin: true, Stdout: true, Stderr: true,
	})
	if err != nil {
		err = fmt.Errorf("attach container %s: %w", ShortID(c.id), classify(err))
		return nil, errors.Join(err, c.remove())
	}
	c.conn = hj.Conn
	pr, pw := io.Pipe()
	c.stdout = pr
	c.done = make(chan struct{})
	go func() {
		_, err := stdcopy.StdCopy(pw, &lineWriter{fn: spec.Stderr}, hj.Reader)
		if err == nil {
			err = io.EOF
		}
		pw.CloseWithError(err)
		close(c.done)
	}()
	if err := d.cli.ContainerStart(ctx, c.id, container.StartOptions{}); err != nil {
		err = fmt.Errorf("start container %s: %w", ShortID(c.id), classify(err))
		return nil, errors.Join(err, c.remove())
	}
	return c, nil
}

// config turns spec into the engine's container configuration: every
// hardening setting of a sandbox is here.
func (d *Docker) config(spec *Spec) (*container.Config, *container.HostConfig) {
	cfg := &container.Config{
		Image:        spec.Image,
		Entrypoint:   spec.Command[:1],
		Cmd:          spec.Command[1:],
		User:         spec.User,
		Hostname:     "sandbox",
		WorkingDir:   "/",
		Labels:       spec.labels(),
		OpenStdin:    true,
		StdinOnce:    false,
		AttachStdin:  true,
		AttachStdout: true,
		AttachStderr: true,
		Tty:          false,
	}
	var mounts []mount.Mount
	hosts := make([]string, 0, len(spec.Binds))
	for host := range spec.Binds {
		hosts = append(hosts, host)
	}
	sort.Strings(hosts)
	for _, host := range hosts {
		mounts = append(mounts, mount.Mount{
			Type: mount.TypeBind, Source: host, Target: spec.Binds[host], ReadOnly: true,
			BindOptions: &mount.BindOptions{Propagation: mount.PropagationRPrivate},
		})
	}
	noOOMDisable := false
	pids := spec.PidsLimit
	hcfg := &container.HostConfig{
		Runtime: spec.Runtime,
		// Loopback only. (Config.NetworkDisabled would remove loopback too,
		// which breaks programs that talk to themselves over 127.0.0.1.)
		NetworkMode:    "none",
		ReadonlyRootfs: true,
		Tmpfs:          spec.Tmpfs,
		ShmSize:        spec.ShmBytes,
		Mounts:         mounts,
		CapDrop:        []string{"ALL"},
		CapAdd:         spec.CapAdd,
		SecurityOpt:    []string{"no-new-privileges"},
		IpcMode:        container.IPCModePrivate,
		Privileged:     false,
		// The agent reads what it needs from the attach stream; a log driver
		// would copy every frame to disk.
		LogConfig: container.LogConfig{Type: "none"},
		Resources: container.Resources{
			Memory:         spec.MemoryBytes,
			MemorySwap:     spec.MemoryBytes, // no swap
			NanoCPUs:       spec.NanoCPUs,
			CPUShares:      spec.CPUShares,
			CpusetCpus:     spec.CPUSet,
			PidsLimit:      &pids,
			OomKillDisable: &noOOMDisable,
		},
	}
	return cfg, hcfg
}

// RemoveAll force-removes every codemode container that carries labels.
func (d *Docker) RemoveAll(ctx context.Context, labels map[string]string, keep map[string]bool) (int, error) {
	args := filters.NewArgs(filters.Arg("label", LabelSandbox+"=1"))
	for k, v := range labels {
		args.Add("label", k+"="+v)
	}
	list, err := d.cli.ContainerList(ctx, container.ListOptions{All: true, Filters: args})
	if err != nil {
		return 0, fmt.Errorf("list containers: %w", classify(err))
	}
	var (
		mu   sync.Mutex
		n    int
		errs []error
		wg   sync.WaitGroup
	)
	for _, c := range list {
		if keep[c.ID] {
			continue
		}
		wg.Go(func() {
			err := d.cli.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true, RemoveVolumes: true})
			mu.Lock()
			defer mu.Unlock()
			if err != nil && !client.IsErrNotFound(err) {
				errs = append(errs, fmt.Errorf("remove container %s: %w", ShortID(c.ID), classify(err)))
				return
			}
			n++
		})
	}
	wg.Wait()
	return n, errors.Join(errs...)
}

type dockerContainer struct {
	d      *Docker
	id     string
	image  string
	conn   net.Conn
	stdout *io.PipeReader
	done   chan struct{}

	removeOnce sync.Once
	removeErr  error
}

func (c *dockerContainer) ID() string            { return c.id }
func (c *dockerContainer) Image() string         { return c.image }
func (c *dockerContainer) Stdin() io.Writer      { return c.conn }
func (c *dockerContainer) Stdout() io.Reader     { return c.stdout }
func (c *dockerContainer) Done() <-chan struct{} { return c.done }

func (c *dockerContainer) Inspect(ctx context.Context) (State, error) {
	info, err := c.d.cli.ContainerInspect(ctx, c.id)
	if err != nil {
		return State{}, fmt.Errorf("inspect container %s: %w", ShortID(c.id), classify(err))
	}
	var st State
	if info.State != nil {
		st.Running = info.State.Running
		st.OOMKilled = info.State.OOMKilled
		st.ExitCode = info.State.ExitCode
		st.StartedAt, _ = time.Parse(time.RFC3339Nano, info.State.StartedAt)
	}
	if info.HostConfig != nil {
		st.Runtime = info.HostConfig.Runtime
		st.CPUShares = info.HostConfig.CPUShares
	}
	return st, nil
}

func (c *dockerContainer) Wait(ctx context.Context) (State, error) {
	okc, errc := c.d.cli.ContainerWait(ctx, c.id, container.WaitConditionNotRunning)
	select {
	case <-okc:
	case err := <-errc:
		if !client.IsErrNotFound(err) {
			return State{}, fmt.Errorf("wait for container %s: %w", ShortID(c.id), classify(err))
		}
	}
	return c.Inspect(ctx)
}

func (c *dockerContainer) SetCPUShares(ctx context.Context, shares int64) error {
	_, err := c.d.cli.ContainerUpdate(ctx, c.id, container.UpdateConfig{Resources: container.Resources{CPUShares: shares}})
	if err != nil {
		return fmt.Errorf("update container %s: %w", ShortID(c.id), classify(err))
	}
	return nil
}

func (c *dockerContainer) Remove(ctx context.Context) error {
	c.removeOnce.Do(func() { c.removeErr = c.removeCtx(ctx) })
	return c.removeErr
}

// remove is Remove with its own bounded context, for clean-up paths.
func (c *dockerContainer) remove() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return c.Remove(ctx)
}

func (c *dockerContainer) removeCtx(ctx context.Context) error {
	if c.conn != nil {
		c.conn.Close()
	}
	err := c.d.cli.ContainerRemove(ctx, c.id, container.RemoveOptions{Force: true, RemoveVolumes: true})
	if err != nil && !client.IsErrNotFound(err) {
		return fmt.Errorf("remove container %s: %w", ShortID(c.id), classify(err))
	}
	return nil
}

// classify marks errors that mean the engine cannot be reached.
func classify(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) {
		return err
	}
	if client.IsErrConnectionFailed(err) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.Contains(err.Error(), "Cannot connect to the Docker daemon") {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// lineWriter passes whole lines (at most 4 KiB each) to fn.
type lineWriter struct {
	fn  func([]byte)
	buf []byte
}

const maxLine = 4096

func (w *lineWriter) Write(p []byte) (int, error) {
	if w.fn == nil {
		return len(p), nil
	}
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			room := maxLine - len(w.buf)
			if len(p) < room {
				w.buf = append(w.buf, p...)
				break
			}
			w.buf = append(w.buf, p[:room]...)
			p = p[room:]
		} else {
			w.buf = append(w.buf, p[:i]...)
			p = p[i+1:]
		}
		w.fn(w.buf)
		w.buf = w.buf[:0]
	}
	return n, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// ShortID is a container id's first 12 characters, as docker ps shows it:
// the form logs and errors name containers by.
func ShortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
