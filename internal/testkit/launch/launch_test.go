package launch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"
)

// childEnv, when set, makes the test binary a child of the kind it names
// instead of running the tests.
const childEnv = "LAUNCH_TEST_CHILD"

func TestMain(m *testing.M) {
	if kind := os.Getenv(childEnv); kind != "" {
		os.Exit(child(kind))
	}
	os.Exit(m.Run())
}

// child is a tiny server as the codemode binaries are: it logs JSON to
// standard error and says where it listens.
//
//   - listen: listens on 127.0.0.1:0, answers "ok" to each connection, and
//     exits 0 on SIGTERM;
//   - stubborn: listens, and ignores SIGTERM;
//   - exit: logs a line and exits 3 without listening;
//   - silent: never listens; exits 0 on SIGTERM.
func child(kind string) int {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	switch kind {
	case "exit":
		log.Error("no configuration")
		return 3
	case "silent":
		log.Info("starting")
		<-term
		return 0
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Error("listen", "err", err)
		return 1
	}
	log.Info("starting")
	log.Info("listening", "addr", ln.Addr().String())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprint(c, "ok")
			c.Close()
		}
	}()
	if kind == "stubborn" {
		signal.Ignore(syscall.SIGTERM)
		select {}
	}
	<-term
	log.Info("stopping")
	return 0
}

func command(t *testing.T, kind string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), childEnv+"="+kind)
	return cmd
}

func TestStartStop(t *testing.T) {
	t.Parallel()
	var watched []string
	p, err := Start(t.Context(), command(t, "listen"), Options{Name: "listener", Watch: func(l string) { watched = append(watched, l) }})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	host, _, err := net.SplitHostPort(p.Addr)
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("Addr = %q (%v), want 127.0.0.1:port", p.Addr, err)
	}
	if p.URL() != "http://"+p.Addr {
		t.Errorf("URL = %q", p.URL())
	}
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatalf("dial Addr: %v", err)
	}
	b := make([]byte, 2)
	if _, err := c.Read(b); err != nil || string(b) != "ok" {
		t.Errorf("read %q, %v; want ok", b, err)
	}
	c.Close()
	if p.Pid() != p.cmd.Process.Pid || p.Pid() == os.Getpid() {
		t.Errorf("Pid = %d", p.Pid())
	}
	if err := p.Stop(time.Minute); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	select {
	case <-p.Exited():
	default:
		t.Fatal("Stop returned before the child exited")
	}
	if err := p.Stop(time.Minute); err != nil { // again: the same answer
		t.Errorf("second Stop: %v", err)
	}
	<-p.read // Watch has seen every line
	logs := p.Logs()
	for _, msg := range []string{`"msg":"starting"`, `"msg":"listening"`, `"msg":"stopping"`} {
		if !strings.Contains(logs, msg) {
			t.Errorf("Logs lack %s:\n%s", msg, logs)
		}
	}
	if got := strings.Join(watched, "\n"); got != logs {
		t.Errorf("Watch saw\n%s\nLogs are\n%s", got, logs)
	}
	if n := len(p.LogLines()); n != 3 {
		t.Errorf("LogLines has %d lines, want 3", n)
	}
}

func TestStopKillsAfterTimeout(t *testing.T) {
	t.Parallel()
	p, err := Start(t.Context(), command(t, "stubborn"), Options{Name: "stubborn"})
	if err != nil {
		t.Fatal(err)
	}
	err = p.Stop(200 * time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "stubborn did not exit within 200ms of SIGTERM") {
		t.Fatalf("Stop = %v, want the child killed after the timeout", err)
	}
	select {
	case <-p.Exited():
	default:
		t.Fatal("Stop returned before the child exited")
	}
	var ee *exec.ExitError
	if err := p.Stop(time.Second); !errors.As(err, &ee) {
		t.Errorf("Stop after the kill = %v, want the exit error", err)
	}
}

func TestStartFails(t *testing.T) {
	t.Parallel()
	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	for _, tc := range []struct {
		name, kind string
		ctx        context.Context
		opts       Options
		want       []string
	}{
		{"exits before listening", "exit", t.Context(), Options{Name: "quitter"},
			[]string{"quitter exited before listening: exit status 3", `"msg":"no configuration"`}},
		// The timeout leaves the child time to start and log under the
		// load of the whole suite; the log line is part of the check.
		{"does not listen in time", "silent", t.Context(), Options{Name: "mute", ListenTimeout: 3 * time.Second},
			[]string{"mute did not listen within 3s", `"msg":"starting"`}},
		{"context ends", "silent", canceled, Options{Name: "mute"},
			[]string{"mute did not listen: context canceled"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := command(t, tc.kind)
			p, err := Start(tc.ctx, cmd, tc.opts)
			if err == nil {
				p.Kill()
				t.Fatal("Start succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if cmd.ProcessState == nil {
				t.Error("Start returned with the child still running")
			}
		})
	}
}

func TestStartNoBinary(t *testing.T) {
	t.Parallel()
	_, err := Start(t.Context(), exec.Command("/nonexistent/agent"), Options{})
	if err == nil || !strings.HasPrefix(err.Error(), "start agent: ") {
		t.Fatalf("Start = %v, want a start error naming agent", err)
	}
}

func TestLineLog(t *testing.T) {
	t.Parallel()
	l := newLineLog(400) // head: 100 bytes; tail: the rest
	for i := range 100 {
		l.add(fmt.Sprintf("line %03d", i)) // 9 bytes with the newline
	}
	lines := l.lines()
	if lines[0] != "line 000" || lines[len(lines)-1] != "line 099" {
		t.Fatalf("first %q, last %q; want line 000 and line 099", lines[0], lines[len(lines)-1])
	}
	size := 0
	for _, s := range lines {
		size += len(s) + 1
	}
	if size > 400+30 {
		t.Errorf("kept %d bytes, limit 400", size)
	}
	// Head: 11 lines (99 bytes); the marker follows.
	if lines[11] == "" || !strings.HasPrefix(lines[11], "[") || !strings.HasSuffix(lines[11], " lines left out]") {
		t.Fatalf("no marker after the head:\n%s", l)
	}
	var dropped int
	fmt.Sscanf(lines[11], "[%d lines left out]", &dropped)
	if kept := len(lines) - 1; kept+dropped != 100 {
		t.Errorf("kept %d and dropped %d of 100 lines", kept, dropped)
	}
}
