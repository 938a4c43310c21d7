package runner

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/codemode-go/codemode/agent/internal/runner/asuser"
	"github.com/codemode-go/codemode/agent/internal/runner/ipc"
	"github.com/codemode-go/codemode/agent/internal/runner/rawfile"
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
// objects and POSIX message queues removed, the workspace and scratch
// directories emptied (POSIX shared memory and named semaphores are files
// in /dev/shm), matplotlib's directory made again from the image (see
// mplConfig), and the interpreter state of sessions dropped; then it
// prestarts the interpreter of the next run (see prestarted). It fails if
// any of that cannot be verified; the agent then destroys the sandbox.
func (s *server) reset(ctx context.Context) error {
	t0 := time.Now()
	s.killKernel()
	clear(s.shells)
	queues, at, err := s.killAndRemoveIPC()
	if err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	t3q := time.Now()
	changed, err := s.wipe()
	if err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	t4 := time.Now()
	if err := s.verifyClean(changed, queues); err != nil {
		return fmt.Errorf("reset: %w", err)
	}
	t5 := time.Now()
	// The sandbox is clean: get the next run's interpreter ready.
	s.prestart()
	s.cfg.log.Debug("reset", "kill", at[0].Sub(t0), "as_user", at[1].Sub(at[0]), "kill_again", at[2].Sub(at[1]), "mqueues", t3q.Sub(at[2]), "wipe", t4.Sub(t3q), "verify", t5.Sub(t4), "prestart", time.Since(t5))
	return nil
}

// killAndRemoveIPC kills every process of the user and removes the user's
// IPC objects. It returns how many message queues it removed, and when
// each of its first three steps ended (for the debug log).
func (s *server) killAndRemoveIPC() (queues int, at [3]time.Time, err error) {
	// First from outside, until /proc shows no process of the user, so
	// that none is left to signal the thread that next acts as the user.
	if err := s.procs.KillUser(nil); err != nil {
		return 0, at, err
	}
	at[0] = time.Now()
	// Then from a thread with the user's credentials (no process to
	// start): kill(-1) reaches every process the user can signal in one
	// step, which forking cannot outrun; and remove the user's IPC objects,
	// which only their owner (or CAP_SYS_ADMIN, which the runner lacks) may
	// do.
	if err := asuser.Do(s.cfg.uid, s.cfg.gid, func() error {
		if err := asuser.KillAll(); err != nil {
			return err
		}
		return ipc.RemoveSysV(&s.ipcFloor)
	}); err != nil {
		return 0, at, err
	}
	at[1] = time.Now()
	// Until whatever kill(-1) reached is gone.
	if err := s.procs.KillUser(nil); err != nil {
		return 0, at, err
	}
	at[2] = time.Now()
	// POSIX message queues, as root (see ipc.OpenMqueues). No process of the
	// user is left to open or make one.
	if s.mqueues == nil {
		return 0, at, s.mqErr
	}
	queues, err = ipc.RemoveMqueues(s.mqueues, s.cfg.uid)
	return queues, at, err
}

// wipe empties the workspace and the scratch directories, and makes them
// and matplotlib's directory again. It returns the directories that were
// not empty.
func (s *server) wipe() (changed []string, err error) {
	for _, d := range append([]string{s.cfg.workspace}, s.cfg.scratch...) {
		n, err := emptyDir(d)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			changed = append(changed, d)
		}
	}
	if err := prepareDirs(s.cfg); err != nil {
		return nil, err
	}
	if s.mpl != nil {
		if err := s.mpl.reset(); err != nil {
			return nil, err
		}
	}
	return changed, nil
}

// verifyClean checks that no process of the user is left, that the
// directories that were not empty (changed) are, and that no message queue
// is left if there were any (queues).
func (s *server) verifyClean(changed []string, queues int) error {
	if ps, err := s.procs.UserProcs(0); err != nil || len(ps) > 0 {
		return fmt.Errorf("user processes left: %v %v", ps, err)
	}
	// No process of the user is left to write into a directory found empty.
	for _, d := range changed {
		names, err := rawfile.Names(d)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if len(names) > 0 {
			return fmt.Errorf("%s is not empty: %d entries left", filepath.Base(d), len(names))
		}
	}
	// Like the directories: read again only if it was not empty.
	if queues > 0 {
		left, err := ipc.UserMqueues(s.mqueues, s.cfg.uid)
		if err != nil {
			return err
		}
		if len(left) > 0 {
			return fmt.Errorf("%d message queues left", len(left))
		}
	}
	return nil
}

// emptyDir removes everything inside dir (a mount point, which stays) and
// returns how many entries it found there. RemoveAll does not follow
// symbolic links, and the runner can enter and remove directories whatever
// their modes.
func emptyDir(dir string) (int, error) {
	names, err := rawfile.Names(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		return 0, fmt.Errorf("empty %s: %w", dir, err)
	}
	var errs []error
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return len(names), fmt.Errorf("empty %s: %w", dir, err)
	}
	return len(names), nil
}
