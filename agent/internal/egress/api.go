package egress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/codemode-go/codemode/agent/internal/wire"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/apis"
)

// apiConn is a program's connection to a configured API; requests on it go
// to that API only, whatever their Host header says.
type apiConn struct {
	*wire.Tunnel
	run *Run
	api *apis.API
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
		tr := &http.Transport{
			Proxy:                 nil,
			DialContext:           (&net.Dialer{Timeout: g.cfg.DialTimeout}).DialContext,
			ForceAttemptHTTP2:     true,
			MaxIdleConnsPerHost:   8,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
		rp := &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				f := pr.In.Context().Value(apiForwardKey{}).(*apiForward)
				pr.Out.URL, pr.Out.Host = f.url, ""
				for k, vs := range f.header {
					pr.Out.Header[k] = vs
				}
			},
			// An API that echoes what it was sent must not hand the
			// credential to the program.
			ModifyResponse: func(res *http.Response) error {
				f := res.Request.Context().Value(apiForwardKey{}).(*apiForward)
				if s := f.secret; len(s) > 0 {
					for k, vs := range res.Header {
						for i, v := range vs {
							if strings.Contains(v, string(s)) {
								res.Header[k][i] = strings.ReplaceAll(v, string(s), apis.Redacted)
							}
						}
					}
					res.Body = &redactReader{r: res.Body, secret: s}
					res.ContentLength = -1
					res.Header.Del("Content-Length")
				}
				return nil
			},
			Transport: tr,
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				c := r.Context().Value(apiConnKey{}).(*apiConn)
				g.cfg.Log.Info("egress api call failed", "tenant", c.run.tenant, "request_id", c.run.requestID, "api", c.api.Name, "error", err)
				msg := "cannot reach the API"
				if errors.Is(err, errByteLimit) {
					msg = "the run's egress byte limit is reached"
				}
				http.Error(w, fmt.Sprintf("codemode egress: %s: %s", c.api.Name, msg), http.StatusBadGateway)
			},
		}
		g.apiSrv = &http.Server{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
				f := &apiForward{url: u, header: h, secret: c.api.Secret(h)}
				rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), apiForwardKey{}, f)))
			}),
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

// apiForward is where one request to an API goes, and with what.
type apiForward struct {
	url    *url.URL
	header http.Header
	secret []byte
}

type apiForwardKey struct{}

// redactReader replaces secret in what it reads with apis.Redacted, holding
// back the end of each read that could be the start of the secret.
type redactReader struct {
	r       io.ReadCloser
	secret  []byte
	pending []byte // read, not yet returned
	out     []byte // redacted, not yet returned
	eof     bool
}

func (r *redactReader) Read(p []byte) (int, error) {
	for len(r.out) == 0 {
		if r.eof {
			if len(r.pending) == 0 {
				return 0, io.EOF
			}
			r.out, r.pending = bytes.ReplaceAll(r.pending, r.secret, []byte(apis.Redacted)), nil
			break
		}
		buf := make([]byte, 32<<10)
		n, err := r.r.Read(buf)
		r.pending = append(r.pending, buf[:n]...)
		if err == io.EOF {
			r.eof = true
		} else if err != nil {
			return 0, err
		}
		red := bytes.ReplaceAll(r.pending, r.secret, []byte(apis.Redacted))
		// Keep back what could be the start of the secret.
		keep := 0
		for k := min(len(r.secret)-1, len(red)); k > 0; k-- {
			if bytes.HasSuffix(red, r.secret[:k]) {
				keep = k
				break
			}
		}
		if !r.eof {
			r.out, r.pending = red[:len(red)-keep], bytes.Clone(red[len(red)-keep:])
		}
	}
	n := copy(p, r.out)
	r.out = r.out[n:]
	return n, nil
}

func (r *redactReader) Close() error { return r.r.Close() }

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
