// Package egressproxy is the HTTP proxy the runner serves on the sandbox's
// loopback, the only way out of a sandbox without a network interface: each
// connection a program opens through it is asked of the agent, which
// decides, resolves and dials, and its bytes travel over the runner's
// stream.
package egressproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// Proxy is the HTTP proxy the runner serves on the sandbox's loopback: the
// only way out of a sandbox without a network interface. User code finds it
// in HTTP_PROXY and HTTPS_PROXY. A CONNECT request becomes one egress
// connection; a plain-HTTP request with an absolute URL is forwarded over
// one. Either way the runner asks the agent with an EgressOpen, which
// decides, resolves and dials; the bytes then travel in EgressData frames
// over the runner's stream (see wire.Tunnels). Connections may be opened
// only while a run goes on, belong to it, and are closed when it ends.
type Proxy struct {
	log     *slog.Logger
	send    func(*runnerv1.Event) error
	tunnels *wire.Tunnels
	ln      []net.Listener
	srv     *http.Server
	fwd     *httputil.ReverseProxy
	tr      *http.Transport
	// refused is told about the first refused connections of a run (the
	// run's stderr).
	refused func(run uint64, line string)
	// refusals counts the refused connections of the current run.
	refusals atomic.Int32

	nextConn atomic.Uint64

	mu      sync.Mutex
	run     uint64                                 // the run that may open connections; 0: none
	pending map[uint64]chan *runnerv1.EgressAnswer // by connection
}

// maxRefusalLines is how many refusals a run is told about on its stderr.
const maxRefusalLines = 16

// egressError is a connection the agent (or the proxy) refused: the proxy
// answers the program with status and reason.
type egressError struct {
	status int
	reason string
}

func (e *egressError) Error() string { return e.reason }

// New listens on addrs (host:port on the sandbox's loopback); an
// address that cannot be listened on is skipped (a sandbox without IPv6
// loopback), but not all of them.
// send sends the proxy's events on the runner's stream; refused tells a run
// (on its stderr) about a connection the egress refused.
func New(log *slog.Logger, addrs []string, send func(*runnerv1.Event) error, refused func(uint64, string)) (*Proxy, error) {
	p := &Proxy{
		log:     log,
		send:    send,
		refused: refused,
		pending: make(map[uint64]chan *runnerv1.EgressAnswer),
	}
	p.tunnels = wire.NewTunnels(
		func(d *runnerv1.EgressData) error {
			return send(&runnerv1.Event{Kind: &runnerv1.Event_EgressData{EgressData: d}})
		},
		func(c *runnerv1.EgressClose) error {
			return send(&runnerv1.Event{Kind: &runnerv1.Event_EgressClose{EgressClose: c}})
		})
	p.tr = &http.Transport{
		Proxy: nil, // never the environment's: that is this proxy
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := splitHostPort(addr, 80)
			if err != nil {
				return nil, &egressError{http.StatusBadRequest, err.Error()}
			}
			return p.open(ctx, host, port)
		},
		DisableCompression:  true,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	p.fwd = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = pr.In.URL
			pr.Out.Host = pr.In.Host
		},
		Transport:     p.tr,
		FlushInterval: -1,
		ErrorHandler:  p.forwardError,
		ErrorLog:      slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	p.srv = &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	var errs []error
	for _, a := range addrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		p.ln = append(p.ln, ln)
		go p.srv.Serve(ln)
	}
	if len(p.ln) == 0 {
		return nil, fmt.Errorf("egress proxy: %w", errors.Join(errs...))
	}
	return p, nil
}

// Addr is the address of the proxy's first listener.
func (p *Proxy) Addr() string { return p.ln[0].Addr().String() }

// Close ends the current run's connections and stops serving.
func (p *Proxy) Close() {
	p.End(0)
	p.srv.Close()
}

// Begin lets run open connections.
func (p *Proxy) Begin(run uint64) {
	p.refusals.Store(0)
	p.mu.Lock()
	p.run = run
	p.mu.Unlock()
}

// End closes the connections of the run that is ending and refuses new
// ones until the next Begin.
func (p *Proxy) End(run uint64) {
	p.mu.Lock()
	if run != 0 && p.run != run {
		p.mu.Unlock()
		return
	}
	p.run = 0
	for id, ch := range p.pending {
		ch <- &runnerv1.EgressAnswer{Conn: id, Status: http.StatusForbidden, Reason: "the run ended"}
		delete(p.pending, id)
	}
	p.mu.Unlock()
	p.tunnels.CloseAll("the run ended")
	p.tr.CloseIdleConnections()
}

// Handle takes an egress request from the agent; it reports whether req was
// one. It never blocks.
func (p *Proxy) Handle(req *runnerv1.Request) bool {
	switch k := req.GetKind().(type) {
	case *runnerv1.Request_EgressAnswer:
		p.mu.Lock()
		ch := p.pending[k.EgressAnswer.GetConn()]
		delete(p.pending, k.EgressAnswer.GetConn())
		p.mu.Unlock()
		if ch != nil {
			ch <- k.EgressAnswer
		}
	case *runnerv1.Request_EgressData:
		p.tunnels.Deliver(k.EgressData)
	case *runnerv1.Request_EgressClose:
		p.tunnels.Closed(k.EgressClose)
	default:
		return false
	}
	return true
}

// open asks the agent for a connection to host:port for the current run.
func (p *Proxy) open(ctx context.Context, host string, port uint32) (*wire.Tunnel, error) {
	id := p.nextConn.Add(1)
	remote := wire.EgressAddr{Host: host, Port: port}
	ch := make(chan *runnerv1.EgressAnswer, 1)
	p.mu.Lock()
	run := p.run
	if run == 0 {
		p.mu.Unlock()
		return nil, &egressError{http.StatusForbidden, "no run is going on: egress is open only while a run goes on"}
	}
	t, err := p.tunnels.Open(id, wire.EgressAddr{Host: "127.0.0.1", Port: wire.ProxyPort}, remote)
	if err != nil {
		p.mu.Unlock()
		return nil, err
	}
	p.pending[id] = ch
	p.mu.Unlock()

	open := &runnerv1.EgressOpen{Conn: id, Host: host, Port: port}
	if err := p.send(&runnerv1.Event{Id: run, Kind: &runnerv1.Event_EgressOpen{EgressOpen: open}}); err != nil {
		p.forget(id)
		t.Close()
		return nil, &egressError{http.StatusBadGateway, "the runner's stream failed"}
	}
	select {
	case a := <-ch:
		if a.GetStatus() != 0 {
			t.Close()
			err := &egressError{int(a.GetStatus()), oneLine(a.GetReason())}
			switch n := p.refusals.Add(1); {
			case n <= maxRefusalLines:
				p.refused(run, fmt.Sprintf("codemode egress: %s:%d refused: %s", host, port, err.reason))
			case n == maxRefusalLines+1:
				p.refused(run, "codemode egress: further refusals of this run are not shown (the result's egress report counts them)")
			}
			return nil, err
		}
		return t, nil
	case <-ctx.Done():
		p.forget(id)
		t.Close()
		return nil, ctx.Err()
	}
}

// Conns is how many connections are open.
func (p *Proxy) Conns() int { return p.tunnels.Len() }

func (p *Proxy) forget(id uint64) {
	p.mu.Lock()
	delete(p.pending, id)
	p.mu.Unlock()
}

// ServeHTTP serves one request of a program: CONNECT, or a plain-HTTP
// request with an absolute URL.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		p.connect(w, r)
		return
	}
	if !r.URL.IsAbs() || r.URL.Scheme != "http" || r.URL.Host == "" {
		http.Error(w, "codemode egress proxy: send an absolute http:// URL, or CONNECT for https", http.StatusBadRequest)
		return
	}
	p.fwd.ServeHTTP(w, r)
}

func (p *Proxy) connect(w http.ResponseWriter, r *http.Request) {
	host, port, err := splitHostPort(r.Host, 443)
	if err != nil {
		http.Error(w, "codemode egress proxy: "+err.Error(), http.StatusBadRequest)
		return
	}
	t, err := p.open(r.Context(), host, port)
	conn, brw, herr := http.NewResponseController(w).Hijack()
	if herr != nil {
		if t != nil {
			t.Close()
		}
		p.log.Warn("egress proxy: hijack", "error", herr)
		return
	}
	defer conn.Close()
	if err != nil {
		writeRefusal(conn, err)
		return
	}
	defer t.Close()
	if _, err := io.WriteString(conn, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	// Bytes the client sent after its CONNECT head, already buffered.
	if n := brw.Reader.Buffered(); n > 0 {
		b, _ := brw.Reader.Peek(n)
		if _, err := t.Write(b); err != nil {
			return
		}
	}
	splice(conn, t)
}

// forwardError answers a plain-HTTP request the proxy could not forward.
func (p *Proxy) forwardError(w http.ResponseWriter, r *http.Request, err error) {
	if conn, _, herr := http.NewResponseController(w).Hijack(); herr == nil {
		defer conn.Close()
		writeRefusal(conn, err)
		return
	}
	http.Error(w, "codemode egress: "+err.Error(), http.StatusBadGateway)
}

// writeRefusal writes a response that ends the connection, with the reason
// in its status line (which Python's http.client and requests show for a
// refused CONNECT) and in its body (which curl shows for plain HTTP).
func writeRefusal(w io.Writer, err error) {
	status, reason := http.StatusBadGateway, oneLine(err.Error())
	var ee *egressError
	if errors.As(err, &ee) {
		status, reason = ee.status, ee.reason
	} else if errors.Is(err, context.Canceled) {
		return
	}
	body := "codemode egress: " + reason + "\n"
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "HTTP/1.1 %d codemode egress: %s\r\n", status, reason)
	fmt.Fprintf(bw, "Content-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Codemode-Egress: refused\r\n\r\n%s", len(body), body)
	bw.Flush()
}

// splice copies both ways until both directions end, passing half closes
// on; a failure either way closes both.
func splice(a net.Conn, b *wire.Tunnel) {
	done := make(chan struct{}, 2)
	go func() {
		if _, err := io.CopyBuffer(b, a, make([]byte, 128<<10)); err != nil {
			b.Close()
		} else {
			b.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		// An error here is the tunnel closed (the run ended, the far end
		// went away): the program's connection goes too.
		if _, err := io.CopyBuffer(a, b, make([]byte, 128<<10)); err != nil {
			a.Close()
		} else if cw, ok := a.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}

// splitHostPort splits a CONNECT target or a URL's host, defaulting the
// port.
func splitHostPort(hostport string, def uint32) (string, uint32, error) {
	host, ps, err := net.SplitHostPort(hostport)
	if err != nil {
		if !strings.Contains(err.Error(), "missing port") {
			return "", 0, fmt.Errorf("bad host %q: %w", hostport, err)
		}
		host, ps = strings.Trim(hostport, "[]"), strconv.Itoa(int(def))
	}
	port, err := strconv.ParseUint(ps, 10, 16)
	if err != nil || port == 0 {
		return "", 0, fmt.Errorf("bad port in %q", hostport)
	}
	if host == "" {
		return "", 0, fmt.Errorf("no host in %q", hostport)
	}
	return host, uint32(port), nil
}

// oneLine makes s fit a status line: no control characters, at most 200
// bytes.
func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > 200 {
		s = s[:200]
	}
	return strings.TrimSpace(s)
}
