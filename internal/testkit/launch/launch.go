// Package launch starts a codemode binary as a child process and waits until
// it listens: until it writes the JSON log line every codemode server writes
// once its listener is open, {"msg":"listening","addr":"host:port",...}. It
// keeps what the child writes to standard error, bounded, for failure
// messages and for tests that look for a log line.
//
// The child must log in JSON (--log-format=json) to standard error; a line
// that is not JSON is kept but never taken for the listening line.
//
// # Lifecycle
//
// [Start] returns once the child listens; [Process.Stop] sends SIGTERM and
// kills the child if it has not exited within a bound; [Process.Kill] kills
// it at once. Both wait for the child and may be called more than once, and
// from several goroutines.
//
// # Errors
//
// Start fails, with the child's log so far in the message, when the child
// cannot be started, exits before it listens, or does not listen within
// [Options.ListenTimeout] or before its context ends; in the last two cases
// it stops the child first.
package launch

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Options tune [Start]. The zero value is ready to use.
type Options struct {
	// Name names the child in errors; empty means the base name of the
	// command's path.
	Name string
	// ListenTimeout bounds the wait for the listening line; 0 means one
	// minute.
	ListenTimeout time.Duration
	// LogLimit bounds the bytes of log kept (see [Process.Logs]); 0 means
	// 8 MiB.
	LogLimit int
	// Watch, if not nil, is called with every line the child writes to
	// standard error, in order, from one goroutine, as it arrives.
	Watch func(line string)
}

// Defaults of [Options].
const (
	DefaultListenTimeout = time.Minute
	DefaultLogLimit      = 8 << 20
)

// failedStopTimeout bounds the graceful stop of a child that did not listen
// in time.
const failedStopTimeout = 10 * time.Second

// drainTimeout bounds the wait for the rest of the log of a child that
// exited before it listened.
const drainTimeout = 5 * time.Second

// Process is a child that listens. Its methods are safe for concurrent use.
type Process struct {
	// Name is [Options.Name] or the base name of the command's path.
	Name string
	// Addr is where the child listens, host:port, as it logged it.
	Addr string

	cmd  *exec.Cmd
	log  *lineLog
	done chan struct{} // closed once the child has exited; err is set
	err  error         // what cmd.Wait returned
	read chan struct{} // closed once standard error is read to its end
}

// Start starts cmd, whose standard error it takes over (cmd.Stderr must be
// nil), and waits until the child logs that it listens. ctx bounds only
// that wait: the child's life is the caller's (see exec.CommandContext).
func Start(ctx context.Context, cmd *exec.Cmd, opts Options) (*Process, error) {
	if cmd.Stderr != nil {
		return nil, fmt.Errorf("start %s: cmd.Stderr is already set", cmd.Path)
	}
	if opts.Name == "" {
		opts.Name = filepath.Base(cmd.Path)
	}
	if opts.ListenTimeout <= 0 {
		opts.ListenTimeout = DefaultListenTimeout
	}
	if opts.LogLimit <= 0 {
		opts.LogLimit = DefaultLogLimit
	}
	// An *os.File, not a pipe made by exec: Wait then neither closes it
	// under the reader nor waits for a grandchild that inherited it.
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", opts.Name, err)
	}
	cmd.Stderr = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("start %s: %w", opts.Name, err)
	}
	p := &Process{
		Name: opts.Name, cmd: cmd, log: newLineLog(opts.LogLimit),
		done: make(chan struct{}), read: make(chan struct{}),
	}
	addrc := make(chan string, 1)
	go p.readLog(r, opts.Watch, addrc)
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	timer := time.NewTimer(opts.ListenTimeout)
	defer timer.Stop()
	select {
	case p.Addr = <-addrc:
		return p, nil
	case <-p.done:
		select { // the last lines may say why
		case <-p.read:
		case <-time.After(drainTimeout):
		}
		return nil, fmt.Errorf("%s exited before listening: %v\n%s", p.Name, p.err, p.Logs())
	case <-timer.C:
		_ = p.Stop(failedStopTimeout)
		return nil, fmt.Errorf("%s did not listen within %v\n%s", p.Name, opts.ListenTimeout, p.Logs())
	case <-ctx.Done():
		_ = p.Stop(failedStopTimeout)
		return nil, fmt.Errorf("%s did not listen: %w\n%s", p.Name, context.Cause(ctx), p.Logs())
	}
}

// readLog keeps the lines of r, hands them to watch, and sends the address
// of the first listening line to addrc.
func (p *Process) readLog(r *os.File, watch func(string), addrc chan<- string) {
	defer close(p.read)
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	found := false
	for sc.Scan() {
		line := sc.Text()
		p.log.add(line)
		if watch != nil {
			watch(line)
		}
		if found {
			continue
		}
		var rec struct {
			Msg  string `json:"msg"`
			Addr string `json:"addr"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "listening" && rec.Addr != "" {
			found = true
			addrc <- rec.Addr
		}
	}
	// A line longer than the scanner's buffer ends the scan; keep reading,
	// so that the child never blocks writing.
	_, _ = io.Copy(io.Discard, r)
}

// URL is the child's base URL, http://Addr.
func (p *Process) URL() string { return "http://" + p.Addr }

// Pid is the child's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Stop sends SIGTERM and waits for the child to exit; after timeout it kills
// it and says so. Otherwise it returns how the child exited (nil for exit
// status 0), as exec.Cmd.Wait reports it.
func (p *Process) Stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
		return p.err
	case <-timer.C:
		p.Kill()
		return fmt.Errorf("%s did not exit within %v of SIGTERM", p.Name, timeout)
	}
}

// Kill kills the child and waits for it to exit.
func (p *Process) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Exited is closed once the child has exited.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Logs returns the lines the child has written to standard error so far,
// joined by newlines. When they exceed [Options.LogLimit], the first lines
// and the latest are kept and a line in between says how many were left out.
func (p *Process) Logs() string { return p.log.String() }

// LogLines is [Process.Logs] as lines.
func (p *Process) LogLines() []string { return p.log.lines() }
