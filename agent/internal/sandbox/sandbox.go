// Package sandbox creates, attaches to and removes the containers that codemode
// runs code in. It knows containers only: what runs inside them (the runner)
// and how sandboxes are pooled live elsewhere.
//
// A Driver starts a container from a Spec, attached from the start, so that
// the first bytes its entry process writes are not lost. The Container it
// returns exposes the entry process's standard input and its demultiplexed
// standard output; its standard error goes to a callback. Drivers and
// containers are safe for concurrent use.
//
// # Errors
//
// Errors that mean the container engine itself cannot be reached wrap
// ErrUnavailable, so callers can tell "the engine is away" from "this
// container failed".
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"time"
)

// Labels that mark codemode's containers.
const (
	// LabelSandbox is set to "1" on every container codemode creates.
	LabelSandbox = "codemode.sandbox"
	// LabelAgent holds the name of the agent that created the container.
	LabelAgent = "codemode.agent"
)

// ErrUnavailable is wrapped by errors that mean the container engine cannot be
// reached (it is down, restarting, or its socket is gone).
var ErrUnavailable = errors.New("container engine unavailable")

// Spec describes a sandbox. Every field is required unless it says otherwise;
// Validate reports what is missing.
type Spec struct {
	// Image to run, e.g. limits.SandboxImage. It must be present
	// locally: drivers never pull.
	Image string
	// Runtime is the OCI runtime, e.g. "runsc".
	Runtime string
	// Command is the entry process: a path inside the container, then its
	// arguments.
	Command []string
	// Binds maps host paths to container paths, mounted read-only.
	Binds map[string]string
	// CapAdd lists the only capabilities the entry process keeps: every other
	// one is dropped. Empty: none.
	CapAdd []string
	// User the entry process runs as, "uid:gid".
	User string
	// MemoryBytes is the memory limit of the whole sandbox (no swap).
	MemoryBytes int64
	// NanoCPUs is the CPU limit in units of 1e-9 CPUs.
	NanoCPUs int64
	// CPUSet, if set, pins the sandbox to these host CPUs, in Docker's
	// --cpuset-cpus syntax ("1", "2-3"); NanoCPUs still bounds it. Empty:
	// any CPU.
	CPUSet string
	// CPUShares, if set, is the sandbox's CPU weight against other
	// containers' (Docker's --cpu-shares; their default is 1024) from its
	// start; Container.SetCPUShares changes it. A weight matters only
	// while CPUs are contended: it never limits the sandbox otherwise.
	// Zero: the engine's default.
	CPUShares int64
	// PidsLimit bounds the processes and threads in the sandbox.
	PidsLimit int64
	// Tmpfs maps writable paths to their tmpfs mount options, e.g.
	// "/workspace" -> "size=64m,mode=0755,uid=65534,gid=65534".
	// Everything else is read-only.
	Tmpfs map[string]string
	// ShmBytes is the size of /dev/shm.
	ShmBytes int64
	// Labels are added to LabelSandbox=1. LabelAgent should be among them.
	Labels map[string]string
	// Stderr, if set, receives what the entry process writes to its standard
	// error, as it comes. It must not block for long.
	Stderr func(line []byte)
}

// Validate reports the first problem with s, or nil.
func (s *Spec) Validate() error {
	switch {
	case s.Image == "":
		return errors.New("sandbox spec: no image")
	case s.Runtime == "":
		return errors.New("sandbox spec: no runtime")
	case len(s.Command) == 0 || s.Command[0] == "":
		return errors.New("sandbox spec: no command")
	case s.User == "":
		return errors.New("sandbox spec: no user")
	case s.MemoryBytes <= 0:
		return errors.New("sandbox spec: memory limit must be positive")
	case s.NanoCPUs <= 0:
		return errors.New("sandbox spec: cpu limit must be positive")
	case s.PidsLimit <= 0:
		return errors.New("sandbox spec: pids limit must be positive")
	case s.CPUShares < 0:
		return errors.New("sandbox spec: cpu shares must not be negative")
	}
	for path, opts := range s.Tmpfs {
		if path == "" || path[0] != '/' {
			return fmt.Errorf("sandbox spec: tmpfs path %q is not absolute", path)
		}
		if opts == "" {
			return fmt.Errorf("sandbox spec: tmpfs %s has no size", path)
		}
	}
	return nil
}

// labels returns the labels of a container made from s.
func (s *Spec) labels() map[string]string {
	l := maps.Clone(s.Labels)
	if l == nil {
		l = map[string]string{}
	}
	l[LabelSandbox] = "1"
	return l
}

// Driver creates and removes sandboxes.
type Driver interface {
	// Start creates a container from spec, attaches to its standard streams and
	// starts it. On error nothing is left behind (best effort when the engine
	// went away meanwhile).
	Start(ctx context.Context, spec Spec) (Container, error)
	// RemoveAll force-removes every container carrying all of labels and
	// LabelSandbox=1, except those whose ids are in keep, and returns how many
	// it removed.
	RemoveAll(ctx context.Context, labels map[string]string, keep map[string]bool) (int, error)
	// ImageID returns the id of the image that image (a name or an id)
	// names now: a rebuilt or retagged image gets a new one.
	ImageID(ctx context.Context, image string) (string, error)
	// Ping reports whether the engine answers. Its error wraps ErrUnavailable.
	Ping(ctx context.Context) error
	// Close releases the driver's connections. Containers are not removed.
	Close() error
}

// Container is one started sandbox.
type Container interface {
	// ID is the engine's id of the container.
	ID() string
	// Image is the id of the image the container was created from.
	Image() string
	// Stdin is the entry process's standard input.
	Stdin() io.Writer
	// Stdout is the entry process's standard output. It returns an error
	// (io.EOF or another) once the process or the attach stream ended.
	Stdout() io.Reader
	// Done is closed once the attach stream has ended: the entry process
	// exited, the container was removed, or the engine went away.
	Done() <-chan struct{}
	// Inspect returns the container's state.
	Inspect(ctx context.Context) (State, error)
	// Wait waits until the container is no longer running, then returns its
	// state.
	Wait(ctx context.Context) (State, error)
	// SetCPUShares sets the container's CPU weight (see Spec.CPUShares).
	SetCPUShares(ctx context.Context, shares int64) error
	// Remove kills and removes the container and closes its streams. It may be
	// called more than once.
	Remove(ctx context.Context) error
}

// State is what the engine knows of a container.
type State struct {
	Running   bool
	OOMKilled bool
	ExitCode  int
	// Runtime is the OCI runtime the container runs under.
	Runtime string
	// StartedAt is when the container started.
	StartedAt time.Time
	// CPUShares is the container's CPU weight; 0 for the engine's default.
	CPUShares int64
}
