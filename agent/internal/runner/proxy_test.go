package runner

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// testEgress maps names ending in ".test" to loopback listeners and refuses
// everything else, as the agent's egress would.
type testEgress struct {
	hosts  map[string]string // host -> loopback address
	opened atomic.Int32
}

func (e *testEgress) Open(ctx context.Context, host string, port uint32) (func(*wire.Tunnel), error) {
	addr, ok := e.hosts[host]
	if !ok {
		return nil, &wire.EgressRefusal{Status: http.StatusForbidden, Reason: fmt.Sprintf("%s:%d is not in this run's egress allowlist", host, port)}
	}
	var d net.Dialer
	up, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	e.opened.Add(1)
	return func(t *wire.Tunnel) {
		defer t.Close()
		defer up.Close()
		done := make(chan struct{})
		go func() { io.Copy(up, t); up.(*net.TCPConn).CloseWrite(); close(done) }()
		io.Copy(t, up)
		t.CloseWrite()
		<-done
	}, nil
}

func (h *harness) runEgress(e wire.Egress, lang, code string) result {
	h.t.Helper()
	var out, errb bytes.Buffer
	exit, err := h.c.RunEgress(h.t.Context(), &runnerv1.Run{Language: lang, Code: code, Timeout: durationpb.New(20 * time.Second)}, func(s wire.Stream, b []byte) {
		if s == wire.Stdout {
			out.Write(b)
		} else {
			errb.Write(b)
		}
	}, e)
	if err != nil {
		h.t.Fatalf("run %s: %v", lang, err)
	}
	return result{exit: exit, stdout: out.String(), stderr: errb.String()}
}

func TestProxyForwardsAndRefuses(t *testing.T) {
	h := newHarness(t)
	big := make([]byte, 3<<20) // several windows
	rand.Read(big)
	sum := sha256.Sum256(big)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			w.Write(big)
		case "/echo":
			b, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s %s host=%s body=%d", r.Method, r.URL.Path, r.Host, len(b))
		default:
			fmt.Fprint(w, "hello from the test server")
		}
	}))
	defer srv.Close()
	e := &testEgress{hosts: map[string]string{"allowed.test": srv.Listener.Addr().String()}}

	t.Run("plain http", func(t *testing.T) {
		r := h.runEgress(e, "bash", "curl -sS http://allowed.test/hi")
		if r.stdout != "hello from the test server" || r.exit.GetCode() != 0 {
			t.Fatalf("got %+v", r)
		}
	})
	t.Run("connect tunnel", func(t *testing.T) {
		// A CONNECT tunnel carries whatever the program speaks; here
		// plain HTTP, as a TLS client would carry TLS.
		r := h.runEgress(e, "bash", "curl -sS -p http://allowed.test:80/big | sha256sum | cut -d' ' -f1")
		if strings.TrimSpace(r.stdout) != fmt.Sprintf("%x", sum) {
			t.Fatalf("got %+v, want the sha256 of the 3 MiB body", r)
		}
	})
	t.Run("upload", func(t *testing.T) {
		r := h.runEgress(e, "bash", "head -c 1000000 /dev/zero | curl -sS --data-binary @- http://allowed.test/echo")
		if r.stdout != "POST /echo host=allowed.test body=1000000" {
			t.Fatalf("got %+v", r)
		}
	})
	t.Run("refused", func(t *testing.T) {
		refusedWithReason(t, h, e)
	})
	t.Run("refused reason in the status line", func(t *testing.T) {
		refusedInStatusLine(t, h, e)
	})
	t.Run("without egress", func(t *testing.T) {
		r := h.run(t.Context(), &runnerv1.Run{Language: "bash", Code: "curl -sS http://allowed.test/hi", Timeout: durationpb.New(20 * time.Second)})
		if !strings.Contains(r.stdout, "may not reach anything outside its sandbox") {
			t.Fatalf("got %+v", r)
		}
	})
	t.Run("no connection between runs", func(t *testing.T) {
		// A background process of a stateful run outlives it; it
		// cannot open a connection while no run goes on.
		var out bytes.Buffer
		run := &runnerv1.Run{Language: "bash", Stateful: true, Timeout: durationpb.New(20 * time.Second),
			Code: "(sleep 0.5; curl -sS http://allowed.test/hi > late.txt 2>&1) &"}
		if _, err := h.c.RunEgress(t.Context(), run, func(_ wire.Stream, b []byte) { out.Write(b) }, e); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1500 * time.Millisecond) // past the background curl: no run goes on meanwhile, so no polling run
		r := h.mustRun("bash", "cat late.txt")
		if !strings.Contains(r.stdout, "no run is going on") {
			t.Fatalf("got %+v", r)
		}
	})
	if n := h.s.proxy.Conns(); n != 0 {
		t.Errorf("%d tunnels left open after the runs", n)
	}
}

// refusedWithReason is TestProxyForwardsAndRefuses' "refused": a refused request
// and a refused CONNECT, each with the reason in the body and on stderr.
func refusedWithReason(t *testing.T, h *harness, e *testEgress) {
	r := h.runEgress(e, "bash", "curl -sS http://denied.test/x; echo; curl -sS -p http://denied.test:80/x; echo exit=$?")
	if !strings.Contains(r.stdout, "codemode egress: denied.test:80 is not in this run's egress allowlist") {
		t.Errorf("stdout %q lacks the refusal's body", r.stdout)
	}
	if !strings.Contains(r.stdout, "exit=56") {
		t.Errorf("stdout %q: want curl's exit 56 for a refused CONNECT", r.stdout)
	}
	if n := strings.Count(r.stderr, "codemode egress: denied.test:80 refused: denied.test:80 is not in this run's egress allowlist\n"); n != 2 {
		t.Errorf("stderr %q: want the refusal twice", r.stderr)
	}
}

// refusedInStatusLine is TestProxyForwardsAndRefuses' "refused reason in the
// status line": a refused CONNECT's reason reaches the program in the status line.
func refusedInStatusLine(t *testing.T, h *harness, e *testEgress) {
	r := h.runEgress(e, "python", `
import http.client, os
c = http.client.HTTPConnection("127.0.0.1", int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1]))
c.set_tunnel("denied.test", 443)
try:
    c.connect()
except OSError as e:
    print(e)
`)
	if want := "Tunnel connection failed: 403 codemode egress: denied.test:443 is not in this run's egress allowlist"; !strings.Contains(r.stdout, want) {
		t.Fatalf("got %+v, want %q", r, want)
	}
}
