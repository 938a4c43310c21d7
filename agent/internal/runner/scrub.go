package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// prepareDirs gives the workspace to the user and makes the scratch
// directories world-writable and sticky, as /tmp is, whatever the mounts
// came with.
func prepareDirs(cfg config) error {
	if err := os.MkdirAll(cfg.workspace, 0o755); err != nil {
		return fmt.Errorf("create workspace: %w", err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(cfg.workspace, cfg.uid, cfg.gid); err != nil {
			return fmt.Errorf("give workspace to the user: %w", err)
		}
	}
	if err := os.Chmod(cfg.workspace, 0o755); err != nil {
		return fmt.Errorf("set workspace mode: %w", err)
	}
	for _, d := range cfg.scratch {
		fi, err := os.Stat(d)
		if err != nil || !fi.IsDir() {
			continue // not mounted in this sandbox
		}
		if err := os.Chmod(d, 0o777|os.ModeSticky); err != nil {
			return fmt.Errorf("set mode of %s: %w", d, err)
		}
	}
	return nil
}

// reset makes the sandbox as clean as a fresh one for the next, unrelated
// run: every user process killed (double-forked, setsid and nohup ones
// included, since they all keep the user's uid), the user's System V IPC
// objects removed, the workspace and scratch directories emptied, and the
// interpreter state of sessions dropped. It fails if any of that cannot be
// verified; the agent then destroys the sandbox.
func (s *server) reset(ctx context.Context) error {
	s.killKernel()
	clear(s.shells)
	// First from outside, until /proc shows no process of the user, so that
	// the user's process limit leaves room for the helper.
	if err := s.procs.killUser(nil); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	// Then from inside the user's uid: kill(-1) reaches every process the
	// user can signal in one step, which forking cannot outrun; and remove
	// the user's IPC objects, which only their owner (or CAP_SYS_ADMIN,
	// which the runner lacks) may do.
	if err := s.runHelper(ctx, "reset"); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	if err := s.procs.killUser(nil); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	for _, d := range append([]string{s.cfg.workspace}, s.cfg.scratch...) {
		if err := emptyDir(d); err != nil {
			return fmt.Errorf("reset: %w", err)
		}
	}
	if err := prepareDirs(s.cfg); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	// Verify.
	if ps, err := s.procs.userProcs(0); err != nil || len(ps) > 0 {
		return fmt.Errorf("reset: user processes left: %v %v", ps, err)
	}
	for _, d := range append([]string{s.cfg.workspace}, s.cfg.scratch...) {
		names, err := readNames(d)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("reset: %w", err)
		}
		if len(names) > 0 {
			return fmt.Errorf("reset: %s is not empty: %d entries left", filepath.Base(d), len(names))
		}
	}
	return nil
}

func readNames(dir string) ([]string, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	return d.Readdirnames(-1)
}

// emptyDir removes everything inside dir (a mount point, which stays).
// RemoveAll does not follow symbolic links, and the runner can enter and
// remove directories whatever their modes.
func emptyDir(dir string) error {
	names, err := readNames(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("empty %s: %w", dir, err)
	}
	var errs []error
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("empty %s: %w", dir, err)
	}
	return nil
}

// runHelper runs the runner's own binary as the user in helper mode and
// waits for it (bounded by 5 s).
func (s *server) runHelper(ctx context.Context, mode string) error {
	p, err := s.procs.start(spec{
		argv:  []string{s.cfg.self},
		env:   []string{helperEnv + "=" + mode},
		files: []*os.File{nil, nil, os.Stderr},
	})
	if err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		killGroup(p.pid)
		<-p.done
		return fmt.Errorf("helper %s did not finish in 5s", mode)
	case <-ctx.Done():
		killGroup(p.pid)
		<-p.done
		return ctx.Err()
	}
	if c := exitCode(p.status); c != 0 {
		return fmt.Errorf("helper %s exited with %d", mode, c)
	}
	return nil
}

// runHelper is the helper's side: it runs as the user, in its own process
// group, with no capabilities.
func runHelper(mode string) error {
	switch mode {
	case "reset":
		if os.Getuid() == 0 {
			return errors.New("the reset helper must not run as root")
		}
		// Kill every process of this uid but this one.
		if err := syscall.Kill(-1, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("kill user processes: %w", err)
		}
		return removeIPC()
	}
	return fmt.Errorf("unknown helper %q", mode)
}
