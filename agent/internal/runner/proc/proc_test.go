package proc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/codemode-go/codemode/agent/internal/wire"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/testenv"
)

// TestUserProcs checks what the scans of KillUser and of a Reset's check
// find: the user's live processes, with their process groups, and neither
// a zombie of the user's, nor a process of the preloaded parent's uid, nor
// one of another uid, nor the process group kept.
func TestUserProcs(t *testing.T) {
	testenv.NeedRoot(t, "starting processes as other users")
	const uid = 54321
	start := func(uid int, pgid bool, argv ...string) *exec.Cmd {
		t.Helper()
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}, Setpgid: pgid}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		return cmd
	}
	user := start(uid, false, "sleep", "60")
	kept := start(uid, true, "sleep", "60")
	parent := start(wire.ParentUID, false, "sleep", "60")
	other := start(uid+1, false, "sleep", "60")
	// A child of the preloaded parent on its way to the user's uid: real
	// uid the parent's, effective the user's (set by root, as the
	// parent's children are by the parent).
	becoming := start(0, false, "python3", "-c", fmt.Sprintf("import os, time\nos.setresuid(%d, %d, %d)\ntime.sleep(60)", wire.ParentUID, uid, wire.ParentUID))
	zombie := start(uid, false, "true") // not waited for until the cleanup

	tab := &Table{cfg: Config{UID: uid, GID: uid}}
	pids := func(keepPgid int) []int {
		ps, err := tab.UserProcs(keepPgid)
		if err != nil {
			t.Fatal(err)
		}
		var out []int
		for _, p := range ps {
			out = append(out, p.Pid)
			if p.Pid == kept.Process.Pid && p.Pgid != kept.Process.Pid {
				t.Errorf("process %d in group %d, want its own", p.Pid, p.Pgid)
			}
		}
		return out
	}
	testkit.WaitFor(t, 5*time.Second, "the zombie to be one", func() bool { return Exited(zombie.Process.Pid) })
	testkit.WaitFor(t, 5*time.Second, "python to set its uids", func() bool {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", becoming.Process.Pid))
		return bytes.Contains(b, []byte(fmt.Sprintf("Uid:\t%d\t%d\t", wire.ParentUID, uid)))
	})
	got := pids(0)
	for _, c := range []struct {
		name string
		pid  int
		want bool
	}{
		{"the user's", user.Process.Pid, true},
		{"the user's in a group of its own", kept.Process.Pid, true},
		{"the preloaded parent's uid", parent.Process.Pid, false},
		{"another uid", other.Process.Pid, false},
		{"the parent's real uid, the user's effective one", becoming.Process.Pid, false},
		{"a zombie of the user's", zombie.Process.Pid, false},
	} {
		if slices.Contains(got, c.pid) != c.want {
			t.Errorf("%s (pid %d): found %v, want %v (found %v)", c.name, c.pid, !c.want, c.want, got)
		}
	}
	if got := pids(kept.Process.Pid); slices.Contains(got, kept.Process.Pid) || !slices.Contains(got, user.Process.Pid) {
		t.Errorf("keeping group %d: found %v, want %d and not %d", kept.Process.Pid, got, user.Process.Pid, kept.Process.Pid)
	}
}
