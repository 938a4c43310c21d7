package egressgate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"github.com/codemode-go/codemode/agent/internal/wire"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/apicatalog"
)

// apiConn is a program's connection to a configured API; requests on it go
// to that API only, whatever their Host header says.
type apiConn struct {
	*wire.Tunnel
	run *Run
	api *apicatalog.API
}

// Read counts what the program sends against the run's byte limit.
func (c *apiConn) Read(p []byte) (int, error) {
	n, err := c.Tunnel.Read(p)
	if n > 0 && !c.run.count(int64(n), true) {
		return 0, errByteLimit
	}
	return n, err
}

// Write counts what the program receives against the run's byte limit.
func (c *apiConn) Write(p []byte) (int, error) {
	if !c.run.count(int64(len(p)), false) {
		return 0, errByteLimit
	}
	return c.Tunnel.Write(p)
}

// count adds n bytes to the run's total and its report; it reports false
// when the total passes the run's limit.
func (r *Run) count(n int64, sent bool) bool {
	total := r.bytes.Add(n)
	if r.limits.Bytes > 0 && total > r.limits.Bytes {
		r.limitReached(executionv1.EgressLimit_EGRESS_LIMIT_BYTES)
		return false
	}
	r.mu.Lock()
	if sent {
		r.report.BytesSent += uint64(n)
	} else {
		r.report.BytesReceived += uint64(n)
	}
	r.mu.Unlock()
	return true
}

type apiConnKey struct{}

// serveAPI serves HTTP on c, forwarding each request to c's API.
func (g *Gate) serveAPI(c *apiConn) {
	g.apiOnce.Do(func() {
		g.apiLn = newChanListener()
		g.apiSrv = &http.Server{
			Handler: g.apiHandler(g.apiProxy()),
			ConnContext: func(ctx context.Context, c net.Conn) context.Context {
				return context.WithValue(ctx, apiConnKey{}, c)
			},
			ReadHeaderTimeout: 30 * time.Second,
			IdleTimeout:       60 * time.Second,
		}
		go g.apiSrv.Serve(g.apiLn)
	})
	if g.apiLn == nil { // closed
		c.Close()
		return
	}
	g.apiLn.push(c)
}

// apiHandler serves a program's request to its connection's API: with
// the API's credential, at the API's URL for the request's path, through
// rp.
func (g *Gate) apiHandler(rp *httputil.ReverseProxy) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := r.Context().Value(apiConnKey{}).(*apiConn)
		h, err := c.api.Header(r.Context())
		if err != nil {
			// The error may name a file; the program gets none of it.
			g.cfg.Log.Warn("egress api credential", "api", c.api.Name, "error", err)
			http.Error(w, fmt.Sprintf("codemode egress: the credential of API %s is not available", c.api.Name), http.StatusBadGateway)
			return
		}
		u, err := c.api.URL(r.URL.EscapedPath(), r.URL.RawQuery)
		if err != nil {
			http.Error(w, fmt.Sprintf("codemode egress: %s: %v", c.api.Name, err), http.StatusBadRequest)
			return
		}
		g.cfg.Log.Info("egress api call", "tenant", c.run.tenant, "request_id", c.run.requestID, "api", c.api.Name, "method", r.Method, "path", r.URL.Path)
		f := &apiForward{url: u, header: h, redactor: c.api.Redactor(h)}
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), apiForwardKey{}, f)))
	})
}

// apiProxy is the reverse proxy to the APIs: each request goes where its
// apiForward in the context says, with its header, and its answer whole
// and redacted.
func (g *Gate) apiProxy() *httputil.ReverseProxy {
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: g.cfg.DialTimeout}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   8,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			f := pr.In.Context().Value(apiForwardKey{}).(*apiForward)
			pr.Out.URL, pr.Out.Host = f.url, ""
			for k, vs := range f.header {
				pr.Out.Header[k] = vs
			}
			// An answer must come whole, in one piece, for the
			// credential to be looked for in it: no ranges (an API
			// may ignore them, and so does the gate), no protocol
			// switch, no trailers either way.
			for _, k := range []string{"Range", "If-Range", "Upgrade", "Connection", "Te", "Trailer"} {
				pr.Out.Header.Del(k)
			}
			pr.Out.Trailer = nil
		},
		// An API that echoes what it was sent must not hand the
		// credential to the program (see apicatalog.Redactor).
		ModifyResponse: func(res *http.Response) error {
			f := res.Request.Context().Value(apiForwardKey{}).(*apiForward)
			return f.redactor.Response(res)
		},
		Transport:    no1xx{tr},
		ErrorHandler: g.apiProxyError,
	}
}

// apiProxyError answers the program when its request could not be
// forwarded or its answer was withheld: 502, saying why in words that
// name no file or credential.
func (g *Gate) apiProxyError(w http.ResponseWriter, r *http.Request, err error) {
	c := r.Context().Value(apiConnKey{}).(*apiConn)
	g.cfg.Log.Info("egress api call failed", "tenant", c.run.tenant, "request_id", c.run.requestID, "api", c.api.Name, "error", err)
	msg := "cannot reach the API"
	switch {
	case errors.Is(err, errByteLimit):
		msg = "the run's egress byte limit is reached"
	case errors.Is(err, apicatalog.ErrEcho):
		msg = "the answer echoes the API's credential and is withheld"
	case errors.Is(err, apicatalog.ErrUnchecked):
		msg = err.Error()
	}
	http.Error(w, fmt.Sprintf("codemode egress: %s: %s", c.api.Name, msg), http.StatusBadGateway)
}

// apiForward is where one request to an API goes, and with what.
type apiForward struct {
	url      *url.URL
	header   http.Header
	redactor *apicatalog.Redactor // nil: no secret to look for
}

type apiForwardKey struct{}

// no1xx makes requests whose informational (1xx) answers are dropped:
// ReverseProxy passes their headers to the program as they come, before
// ModifyResponse could look at them. The request goes out with a context
// that keeps the original's cancellation but not its values, the proxy's
// trace among them.
type no1xx struct{ next http.RoundTripper }

func (t no1xx) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(context.Background())
	stop := context.AfterFunc(req.Context(), cancel)
	res, err := t.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		stop()
		cancel()
		return nil, err
	}
	res.Request = req
	res.Body = &cancelBody{ReadCloser: res.Body, cancel: func() { stop(); cancel() }}
	return res, nil
}

// cancelBody ends a request's context when its answer's body is closed.
type cancelBody struct {
	io.ReadCloser
	cancel func()
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// chanListener is a net.Listener of connections pushed to it.
type chanListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newChanListener() *chanListener {
	return &chanListener{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (l *chanListener) push(c net.Conn) {
	select {
	case l.ch <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return wire.EgressAddr{Host: "api.codemode"} }
