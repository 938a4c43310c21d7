package asuser

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/testenv"
)

// Each test gets uids of its own, far from real accounts and from those of
// the runner's tests (62000 up), which may run at the same time: killing
// "every process of the user" must stay within the test.
var nextUID atomic.Int32

func testUID() int { return 61000 + int(nextUID.Add(1)) }

func isRoot() bool { return os.Geteuid() == 0 }

// TestAsUser checks that f runs with the user's uids and no capability,
// that no other goroutine ever sees the user's credentials, even while
// Do runs concurrently with them, and that the thread is gone
// afterwards.
func TestAsUser(t *testing.T) {
	if !isRoot() {
		testenv.Missing(t, "switching a thread to another uid needs root")
	}
	uid := testUID()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	bad := make(chan string, 1)
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if r, e, s := unix.Getresuid(); r != 0 || e != 0 || s != 0 {
					select {
					case bad <- fmt.Sprintf("a runner goroutine ran with uids %d %d %d", r, e, s):
					default:
					}
				}
				runtime.Gosched()
			}
		})
	}
	rootDir := t.TempDir()
	if err := os.Chmod(rootDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		var got [3]int
		err := Do(uid, uid, func() error {
			got[0], got[1], _ = unix.Getresuid()
			got[2] = unix.Geteuid()
			if g := unix.Getgid(); g != uid {
				return fmt.Errorf("gid %d", g)
			}
			if gs, err := unix.Getgroups(); err != nil || len(gs) != 0 {
				return fmt.Errorf("groups %v %v", gs, err)
			}
			// The user cannot act as root: a file only root may write.
			f, err := os.OpenFile(filepath.Join(rootDir, "x"), os.O_CREATE|os.O_WRONLY, 0o600)
			if err == nil {
				f.Close()
				return fmt.Errorf("created a file in a directory of root")
			}
			return nil
		})
		if err != nil {
			t.Fatalf("Do #%d: %v", i, err)
		}
		if got != [3]int{uid, uid, uid} {
			t.Fatalf("Do #%d: uids %v, want %d", i, got, uid)
		}
	}
	close(stop)
	wg.Wait()
	select {
	case msg := <-bad:
		t.Fatal(msg)
	default:
	}
	if r, e, s := unix.Getresuid(); r != 0 || e != 0 || s != 0 {
		t.Fatalf("after Do: uids %d %d %d", r, e, s)
	}
	// The threads that held the user's credentials end (they are root
	// again before they do).
	testkit.Eventually(t, 5*time.Second, func() error {
		if left := threadsOfUID(t, uid); left != 0 {
			return fmt.Errorf("%d threads of the runner still hold uid %d", left, uid)
		}
		return nil
	})
	if err := Do(os.Getuid(), os.Getgid(), func() error { return nil }); err == nil {
		t.Fatal("Do with the runner's own uid succeeded")
	}
}

// threadsOfUID counts the threads of this process whose real uid is uid.
func threadsOfUID(t *testing.T, uid int) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "status"))
		if err != nil {
			continue // ended meanwhile
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" && f[1] == fmt.Sprint(uid) {
				n++
			}
		}
	}
	return n
}

// TestKillAllOfUser checks that kill(-1) from a thread of the user kills the
// user's processes, a new session's included, and nobody else's: not the
// runner's, not root's, not another uid's.
func TestKillAllOfUser(t *testing.T) {
	if !isRoot() {
		testenv.Missing(t, "switching a thread to another uid needs root")
	}
	t.Parallel()
	uid, other := testUID(), testUID()
	start := func(uid int, setsid bool) *exec.Cmd {
		cmd := exec.Command("sleep", "3600")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: setsid}
		if uid != 0 {
			cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	users := []*exec.Cmd{start(uid, false), start(uid, true)}
	spared := []*exec.Cmd{start(0, false), start(other, false), start(other, true)}
	if err := Do(uid, uid, KillAll); err != nil {
		t.Fatal(err)
	}
	for _, c := range users {
		err := c.Wait()
		if ws, ok := c.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("process of the user: %v, want killed by SIGKILL", err)
		}
	}
	for _, c := range spared {
		if err := c.Process.Signal(syscall.Signal(0)); err != nil {
			t.Fatalf("process of uid %v was killed too: %v", c.SysProcAttr.Credential, err)
		}
	}
}

// TestFileThread checks that the file thread acts as the user towards the file
// system (what it creates is the user's, a file only root may read is
// refused) while the user's processes cannot signal its thread, which they
// can with Do: kill(2) of a thread id checks the sender's uids against
// that thread's real and saved uid.
func TestFileThread(t *testing.T) {
	if !isRoot() {
		t.Skip("switching a thread to another uid needs root")
	}
	t.Parallel()
	uid := testUID()
	userDir, rootOnly := fileThreadDirs(t, uid)
	for _, tc := range []struct {
		name       string
		as         func(int, int, func() error) error
		ruid       int
		signalable bool
	}{
		{"fileThread", func(uid, gid int, f func() error) error {
			ft, err := StartFileThread(uid, gid)
			if err != nil {
				return err
			}
			defer ft.Close()
			return ft.Do(f)
		}, 0, false},
		{"asUser", Do, uid, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tids := make(chan int)
			done := make(chan struct{})
			errc := make(chan error, 1)
			go func() {
				errc <- tc.as(uid, uid, func() error {
					if r, e, s := unix.Getresuid(); r != tc.ruid || e != uid || s != 0 {
						return fmt.Errorf("uids %d %d %d, want %d %d 0", r, e, s, tc.ruid, uid)
					}
					f, err := os.Create(filepath.Join(userDir, tc.name))
					if err != nil {
						return err
					}
					f.Close()
					if _, err := os.ReadFile(rootOnly); !errors.Is(err, os.ErrPermission) {
						return fmt.Errorf("read a file only root may read: %v", err)
					}
					tids <- unix.Gettid()
					<-done
					return nil
				})
			}()
			var tid int
			select {
			case tid = <-tids:
			case err := <-errc:
				t.Fatal(err)
			}
			// A process of the user checks whether it may signal the thread.
			cmd := exec.Command("/bin/sh", "-c", fmt.Sprintf("kill -0 %d", tid))
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
			out, err := cmd.CombinedOutput()
			close(done)
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if signalable := err == nil; signalable != tc.signalable {
				t.Errorf("the user may signal the thread: %v (%s), want %v", signalable, bytes.TrimSpace(out), tc.signalable)
			}
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(userDir, tc.name), &st); err != nil || int(st.Uid) != uid || int(st.Gid) != uid {
				t.Errorf("created file owned by %d:%d (%v), want %d", st.Uid, st.Gid, err, uid)
			}
		})
	}
}

// fileThreadDirs makes TestFileThread's directory of uid's and a file only
// root may read, beside it.
func fileThreadDirs(t *testing.T, uid int) (userDir, rootOnly string) {
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	userDir, rootOnly = filepath.Join(dir, "user"), filepath.Join(dir, "root-only")
	if err := os.Mkdir(userDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(userDir, uid, uid); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(rootOnly, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	return userDir, rootOnly
}
