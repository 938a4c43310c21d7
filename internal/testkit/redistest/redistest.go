// Package redistest starts a real redis-server for tests: on a free loopback
// port, in a temporary directory, with no persistence, stopped when the
// test ends, and with a random password, as `make up-cluster` runs it, so
// that other users of the host cannot reach it. The configuration, password
// included, goes to the server on its standard input, never on its command
// line. The host set-up (agent/host/setup.sh) installs Debian's
// redis-server; a test fails, saying so, where it is missing.
package redistest

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Server is a running redis-server.
type Server struct {
	// Addr is 127.0.0.1:port (or the address given to StartTLSOn).
	Addr string
	// Password is the password the server wants (AUTH).
	Password string
	// URL is redis://:Password@Addr/0.
	URL    string
	cmd    *exec.Cmd
	exited chan string
}

// Kill kills the server at once, as a crash would, and waits for it.
func (s *Server) Kill() {
	_ = s.cmd.Process.Kill()
	if log, ok := <-s.exited; ok {
		s.exited <- log // for the clean-up
	}
}

// startTimeout bounds the wait for the server to accept connections.
const startTimeout = 10 * time.Second

// Start starts a redis-server and stops it when tb ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redis-server is not installed: run agent/host/setup.sh (make setup), which installs Debian's redis-server: %v", err)
	}
	var last error
	for range 3 { // a free port can be taken between choosing and binding it
		s, err := start(tb, path)
		if err == nil {
			return s
		}
		last = err
	}
	tb.Fatalf("start redis-server: %v", last)
	return nil
}

// TLS is the certificate and key a server started with StartTLS presents,
// and the CA that signed them (PEM files).
type TLS struct {
	CertFile, KeyFile, CAFile string
}

// StartTLS starts a redis-server that speaks TLS only (Redis's built-in
// TLS), with c's certificate, and stops it when tb ends. Its URL is
// rediss://:Password@Addr/0.
func StartTLS(tb testing.TB, c TLS) *Server {
	tb.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redis-server is not installed: run agent/host/setup.sh (make setup), which installs Debian's redis-server: %v", err)
	}
	var last error
	for range 3 {
		s, err := startWith(tb, path, &c)
		if err == nil {
			return s
		}
		last = err
	}
	tb.Fatalf("start redis-server with TLS: %v", last)
	return nil
}

// Host is where StartTLSOn runs a server: a network namespace standing in
// for a host (see internal/testkit/netns).
type Host interface {
	// Command is exec.Command of name with args run on the host.
	Command(name string, args ...string) *exec.Cmd
	// DialContext dials from inside the host.
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// StartTLSOn is StartTLS on host h, listening on ip:port, an address of h.
func StartTLSOn(tb testing.TB, c TLS, h Host, ip string, port int) *Server {
	tb.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("redis-server is not installed: run agent/host/setup.sh (make setup), which installs Debian's redis-server: %v", err)
	}
	s, err := startOn(tb, path, &c, &where{host: h, ip: ip, port: port})
	if err != nil {
		tb.Fatalf("start redis-server with TLS on %s:%d: %v", ip, port, err)
	}
	return s
}

// where is the host and address of a server; nil means this host's
// loopback and a free port.
type where struct {
	host Host
	ip   string
	port int
}

func start(tb testing.TB, path string) (*Server, error) { return startWith(tb, path, nil) }

func startWith(tb testing.TB, path string, tc *TLS) (*Server, error) {
	return startOn(tb, path, tc, nil)
}

func startOn(tb testing.TB, path string, tc *TLS, w *where) (*Server, error) {
	ip, port, dial := "127.0.0.1", 0, (&net.Dialer{}).DialContext
	cmd := exec.Command(path, "-")
	if w != nil {
		ip, port, dial, cmd = w.ip, w.port, w.host.DialContext, w.host.Command(path, "-")
	} else {
		var err error
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	dir := tb.TempDir()
	var pw [16]byte
	_, _ = rand.Read(pw[:])
	password := hex.EncodeToString(pw[:])
	listen := fmt.Sprintf("port %d\n", port)
	if tc != nil {
		listen = fmt.Sprintf("port 0\ntls-port %d\ntls-cert-file %q\ntls-key-file %q\ntls-ca-cert-file %q\ntls-auth-clients no\n",
			port, tc.CertFile, tc.KeyFile, tc.CAFile)
	}
	cmd.Stdin = strings.NewReader(fmt.Sprintf("%sbind %s\nsave \"\"\nappendonly no\ndir %q\ndaemonize no\nloglevel warning\nrequirepass %s\n",
		listen, ip, dir, password))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan string, 1)
	go func() {
		var b strings.Builder
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if b.Len() < 4096 {
				b.WriteString(sc.Text() + "\n")
			}
		}
		_ = cmd.Wait()
		exited <- b.String()
	}()
	s := &Server{Addr: net.JoinHostPort(ip, strconv.Itoa(port)), Password: password, cmd: cmd, exited: exited}
	s.URL = "redis://:" + password + "@" + s.Addr + "/0"
	var roots *x509.CertPool
	if tc != nil {
		s.URL = "rediss://:" + password + "@" + s.Addr + "/0"
		b, err := os.ReadFile(tc.CAFile)
		if err != nil {
			_ = cmd.Process.Kill()
			return nil, err
		}
		roots = x509.NewCertPool()
		roots.AppendCertsFromPEM(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		if err := ping(ctx, dial, s.Addr, password, roots); err == nil {
			break
		}
		select {
		case log := <-exited:
			return nil, fmt.Errorf("redis-server exited: %s", strings.TrimSpace(log))
		case <-ctx.Done():
			_ = cmd.Process.Kill()
			return nil, fmt.Errorf("redis-server on %s did not answer within %s", s.Addr, startTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
	tb.Cleanup(s.Kill)
	return s, nil
}

// ping sends AUTH password and PING, and expects +OK and +PONG; over TLS
// trusting roots if they are set.
func ping(ctx context.Context, dial func(context.Context, string, string) (net.Conn, error), addr, password string, roots *x509.CertPool) error {
	c, err := dial(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	if roots != nil {
		host, _, _ := net.SplitHostPort(addr)
		tc := tls.Client(c, &tls.Config{RootCAs: roots, ServerName: host, MinVersion: tls.VersionTLS12})
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return err
		}
		c = tc
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("AUTH " + password + "\r\nPING\r\n")); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	for _, want := range []string{"+OK", "+PONG"} {
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		if !strings.HasPrefix(line, want) {
			return fmt.Errorf("answered %q, want %s", line, want)
		}
	}
	return nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
