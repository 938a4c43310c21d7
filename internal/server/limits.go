package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/netutil"
)

// Limits bound what one client can take from a Server: memory for request
// bodies, time to send them, idle connections and connections overall. The
// zero Limits bounds none of these (ReadHeaderTimeout is always set).
type Limits struct {
	// MaxRequestBytes bounds the body of every request. A Connect, gRPC or
	// gRPC-Web request whose message is larger is refused by Connect itself
	// with resource_exhausted; a plain HTTP request (MCP, seed endpoints)
	// with HTTP 413. A body that declares a larger Content-Length is refused
	// before any of it is read; one that does not is cut off at the limit.
	// 0: no limit.
	MaxRequestBytes int64
	// BodyTimeout bounds how long a client may take to send a request's
	// body, counted from when the server has read its header. It ends when
	// the body has been read to its end, so it does not limit how long a
	// call runs, how long a server stream or an SSE response lasts, or
	// requests with no body; but a client-streaming or bidirectional call
	// (server reflection) must finish sending within it. A client still
	// sending when it passes has its request fail and, on HTTP/1.1, its
	// connection closed. 0: none.
	BodyTimeout time.Duration
	// IdleTimeout closes a connection that has had no request in flight for
	// this long. 0: none.
	IdleTimeout time.Duration
	// MaxConns caps the connections open at once; further clients wait to be
	// accepted. 0: no cap.
	MaxConns int
	// LargeBodies is how many requests may read a body larger than 1 MiB at
	// once. Handlers hold a body in memory as they read it (Connect doubles
	// its buffer as it grows), so this bounds what large bodies take of
	// the server's memory as a whole, where MaxRequestBytes bounds one. A
	// request whose body passes 1 MiB while others have every turn waits
	// for one, until its body timeout; smaller bodies never wait. A request
	// that gets no turn fails: resource_exhausted for Connect, gRPC and
	// gRPC-Web, a read error for plain HTTP handlers. 0: no limit.
	LargeBodies int
}

// Defaults for public servers (see DefaultLimits).
const (
	// DefaultMaxRequestBytes allows a run's largest code (256 KiB) and
	// stdin (1 MiB) with a file of the largest size (4 MiB).
	DefaultMaxRequestBytes = 8 << 20
	// DefaultBodyTimeout lets a client on a slow link (300 KB/s) send a
	// body of DefaultMaxRequestBytes.
	DefaultBodyTimeout = 30 * time.Second
	// DefaultIdleTimeout keeps connections for clients that call every
	// minute or so, not for ones that went away.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultLargeBodies lets one request at a time read a body over 1 MiB.
	// Connect doubles its buffer as a message grows, so reading a body of
	// DefaultMaxRequestBytes allocates about 30 MB; with the garbage
	// collector's headroom, an edge sent four 100 MB bodies at once peaks
	// near 95 MB resident with one turn, 147 MB with two, 176 MB with no
	// limit. Small bodies, nearly every run, never wait.
	DefaultLargeBodies = 1
	// DefaultMaxConns is far more connections than one edge's runs need
	// (a client multiplexes its calls over one HTTP/2 connection), and
	// keeps a flood of connections to a bounded number of file descriptors.
	DefaultMaxConns = 1024
)

// DefaultLimits returns the limits a public server should have.
func DefaultLimits() Limits {
	return Limits{
		MaxRequestBytes: DefaultMaxRequestBytes,
		BodyTimeout:     DefaultBodyTimeout,
		IdleTimeout:     DefaultIdleTimeout,
		MaxConns:        DefaultMaxConns,
		LargeBodies:     DefaultLargeBodies,
	}
}

// Validate reports whether l can be used.
func (l Limits) Validate() error {
	var errs []error
	if l.MaxRequestBytes < 0 {
		errs = append(errs, fmt.Errorf("max request bytes %d is negative", l.MaxRequestBytes))
	}
	if l.MaxRequestBytes > 1<<30 {
		errs = append(errs, fmt.Errorf("max request bytes %d is over 1 GiB", l.MaxRequestBytes))
	}
	if l.BodyTimeout < 0 {
		errs = append(errs, fmt.Errorf("body timeout %s is negative", l.BodyTimeout))
	}
	if l.IdleTimeout < 0 {
		errs = append(errs, fmt.Errorf("idle timeout %s is negative", l.IdleTimeout))
	}
	if l.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("max conns %d is negative", l.MaxConns))
	}
	if l.LargeBodies < 0 {
		errs = append(errs, fmt.Errorf("large bodies %d is negative", l.LargeBodies))
	}
	return errors.Join(errs...)
}

// envelopeSlack is what the body of a Connect, gRPC or gRPC-Web request may
// hold beyond its message: the 5-byte envelope of each message, and room for
// compression's overhead. The body limit of such a request is
// MaxRequestBytes plus this, so that Connect's own limit on the message,
// which answers resource_exhausted in the request's protocol, is reached
// first.
const envelopeSlack = 64 << 10

// connectOptions returns the Connect handler options that apply l.
func (l Limits) connectOptions() []connect.HandlerOption {
	if l.MaxRequestBytes == 0 {
		return nil
	}
	return []connect.HandlerOption{connect.WithReadMaxBytes(int(l.MaxRequestBytes))}
}

// listener returns ln capped at MaxConns connections. (netutil's
// connections hide *net.TCPConn's CloseWrite: net/http then closes a
// connection whose upload it refused without a half-close first; clients
// still got the answer in tests.)
func (l Limits) listener(ln net.Listener) net.Listener {
	if l.MaxConns == 0 {
		return ln
	}
	return netutil.LimitListener(ln, l.MaxConns)
}

// rpcBody bounds the bodies of requests to h, a Connect handler (gRPC,
// gRPC-Web and Connect): a declared Content-Length over the limit is
// answered resource_exhausted in the request's protocol without reading the
// body; otherwise Connect enforces MaxRequestBytes on each message, and the
// body as a whole is cut off a little above it, in case a stream sends many.
func (s *Server) rpcBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limit := s.Limits.MaxRequestBytes
		if limit == 0 || !hasBody(r) {
			s.withTurns(h, true).ServeHTTP(w, r)
			return
		}
		if r.ContentLength > limit+envelopeSlack {
			s.logger.Debug("request body too large", "request_id", r.Header.Get(RequestIDHeader), "path", r.URL.Path, "content_length", r.ContentLength)
			WriteError(w, r, connect.NewError(connect.CodeResourceExhausted, tooLarge(r.ContentLength, limit)))
			return
		}
		r = shallow(r)
		r.Body = http.MaxBytesReader(w, r.Body, limit+envelopeSlack)
		s.withTurns(h, true).ServeHTTP(w, r)
	})
}

// plainBody bounds the bodies of requests to h, a plain HTTP handler: a
// declared Content-Length over the limit is answered 413 without reading
// the body; otherwise the body is cut off at the limit with an
// *http.MaxBytesError, which h must answer 413 (the MCP SDK and the seed
// endpoints do).
func (s *Server) plainBody(h http.Handler, refuse func(http.ResponseWriter, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		limit := s.Limits.MaxRequestBytes
		if limit == 0 || !hasBody(r) {
			s.withTurns(h, false).ServeHTTP(w, r)
			return
		}
		if r.ContentLength > limit {
			s.logger.Debug("request body too large", "request_id", r.Header.Get(RequestIDHeader), "path", r.URL.Path, "content_length", r.ContentLength)
			refuse(w, tooLarge(r.ContentLength, limit))
			return
		}
		r = shallow(r)
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		s.withTurns(h, false).ServeHTTP(w, r)
	})
}

// refuseTooLarge answers a plain HTTP request whose body is too large with
// 413 and a JSON body {"error": message, "code": "resource_exhausted"}.
func refuseTooLarge(w http.ResponseWriter, err error) {
	writeHTTPError(w, http.StatusRequestEntityTooLarge, connect.NewError(connect.CodeResourceExhausted, err))
}

func tooLarge(size, limit int64) error {
	return fmt.Errorf("request body of %d bytes is larger than the limit of %d bytes", size, limit)
}

// writeHTTPError answers a plain HTTP request with status and a JSON body
// {"error": message, "code": code}, as WriteError does with the status
// Connect uses for the code.
func writeHTTPError(w http.ResponseWriter, status int, err *connect.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Message(), "code": err.Code().String()})
}

// bodyDeadline gives every request with a body BodyTimeout to send it: it
// sets a read deadline on the request (on HTTP/1.1 the connection's, on
// HTTP/2 the stream's) and clears it once the body has been read to its
// end.
//
// On HTTP/1.1 the deadline is the connection's. Once the body is done, the
// server reads the connection in the background to notice a client that
// goes away, and a deadline passing during that read would cancel the
// request's context, cutting long runs, server streams and SSE responses.
// net/http clears the deadline when it starts that read; clearing it here
// too keeps this safe whatever net/http does (on HTTP/2 it stops the
// stream's timer). Requests with no body get no deadline at all: their
// background read starts before the handler. A handler that stops reading
// before the end keeps the deadline: what is left of the body is then
// discarded under it, or the connection closed.
func (s *Server) bodyDeadline(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d := s.Limits.BodyTimeout
		if d == 0 || !hasBody(r) {
			h.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(d)); err != nil {
			s.logger.Debug("no body deadline", "request_id", r.Header.Get(RequestIDHeader), "error", err)
			h.ServeHTTP(w, r)
			return
		}
		b := &deadlineBody{ReadCloser: r.Body, rc: rc}
		defer b.end()
		r = shallow(r)
		r.Body = b
		h.ServeHTTP(w, r)
	})
}

// deadlineBody clears the read deadline of its request once it has been
// read to its end, unless its handler has returned (a ResponseController
// must not be used then).
type deadlineBody struct {
	io.ReadCloser
	mu sync.Mutex
	rc *http.ResponseController // nil once cleared or ended
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.mu.Lock()
		if b.rc != nil {
			_ = b.rc.SetReadDeadline(time.Time{})
			b.rc = nil
		}
		b.mu.Unlock()
	}
	return n, err
}

// end is called when the handler has returned.
func (b *deadlineBody) end() {
	b.mu.Lock()
	b.rc = nil
	b.mu.Unlock()
}

// hasBody reports whether r has a body to read.
func hasBody(r *http.Request) bool {
	return r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
}

// shallow returns a copy of r whose Body may be replaced without touching
// r, which the HTTP server keeps to finish the request.
func shallow(r *http.Request) *http.Request {
	r2 := new(http.Request)
	*r2 = *r
	return r2
}

// rpc bounds the bodies of a Connect handler mounted at path (see rpcBody).
func (s *Server) rpc(path string, h http.Handler) (string, http.Handler) {
	return path, s.rpcBody(h)
}

// largeBody is the size past which a body needs a turn (see
// Limits.LargeBodies).
const largeBody = 1 << 20

// largeBodyTurns hands out the turns to read large bodies.
type largeBodyTurns struct {
	once sync.Once
	ch   chan struct{} // a slot per turn held
}

func (t *largeBodyTurns) slots(n int) chan struct{} {
	t.once.Do(func() { t.ch = make(chan struct{}, n) })
	return t.ch
}

// withTurns makes the body of every request to h wait for a turn once it
// passes largeBody bytes; rpc says h is a Connect handler.
func (s *Server) withTurns(h http.Handler, rpc bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.Limits.LargeBodies
		if n == 0 || !hasBody(r) || (r.ContentLength >= 0 && r.ContentLength <= largeBody) {
			h.ServeHTTP(w, r)
			return
		}
		b := &turnBody{ReadCloser: r.Body, slots: s.turns.slots(n), ctx: r.Context(), rpc: rpc}
		if d := s.Limits.BodyTimeout; d > 0 {
			b.deadline = time.Now().Add(d)
		}
		defer b.end()
		r = shallow(r)
		r.Body = b
		h.ServeHTTP(w, r)
	})
}

// turnBody is a request body that takes a turn before it reads past
// largeBody bytes, and gives it back at its end or its handler's.
type turnBody struct {
	io.ReadCloser
	slots    chan struct{}
	ctx      context.Context
	deadline time.Time // to wait for a turn; zero: as long as ctx
	rpc      bool
	read     int64
	state    atomic.Int32 // turnNone, turnHeld, turnEnded
}

const (
	turnNone int32 = iota
	turnHeld
	// turnEnded: the body was read to its end or failed, or its handler
	// returned; later reads (the server's discarding) need no turn.
	turnEnded
)

func (b *turnBody) Read(p []byte) (int, error) {
	if b.state.Load() == turnNone {
		switch {
		case b.read+int64(len(p)) <= largeBody:
		case b.read < largeBody:
			p = p[:largeBody-b.read]
		default:
			if err := b.take(); err != nil {
				return 0, err
			}
		}
	}
	n, err := b.ReadCloser.Read(p)
	b.read += int64(n)
	if err != nil {
		b.end()
	}
	return n, err
}

// take waits for a turn, until the body's deadline.
func (b *turnBody) take() error {
	var expired <-chan time.Time
	if !b.deadline.IsZero() {
		t := time.NewTimer(time.Until(b.deadline))
		defer t.Stop()
		expired = t.C
	}
	select {
	case b.slots <- struct{}{}:
		if !b.state.CompareAndSwap(turnNone, turnHeld) {
			<-b.slots
		}
		return nil
	case <-b.ctx.Done():
		return b.ctx.Err()
	case <-expired:
		msg := errors.New("the server is busy reading other large requests: retry after 1s")
		if !b.rpc {
			return msg
		}
		err := connect.NewError(connect.CodeResourceExhausted, msg)
		err.Meta().Set("Retry-After", "1")
		return err
	}
}

// end gives back the turn, if the body holds one: at its end, or its
// handler's.
func (b *turnBody) end() {
	if b.state.Swap(turnEnded) == turnHeld {
		<-b.slots
	}
}
