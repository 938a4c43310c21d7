// Package server serves one or more Connect services on a single port, so that
// gRPC, gRPC-Web and Connect (JSON and binary) clients all reach the same
// address. It adds what every codemode service needs: HTTP/2 without TLS (h2c),
// gRPC health checks, gRPC server reflection, protovalidate on every request,
// CORS for browsers (refusing pages of other origins and rebound host names
// when told to), a ReadHeaderTimeout, optional Limits on request bodies
// and connections, and graceful shutdown.
//
// A Server is configured before Serve and must not be changed afterwards.
package server

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"buf.build/go/protovalidate"
	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"connectrpc.com/validate"
)

// Defaults for the HTTP server.
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultShutdownTimeout   = 10 * time.Second
)

// Server is an HTTP server for Connect services.
type Server struct {
	logger   *slog.Logger
	mux      *http.ServeMux
	services []string
	health   *grpchealth.StaticChecker
	opts     []connect.HandlerOption

	// ShutdownTimeout bounds how long Serve waits for in-flight requests once
	// its context is done. Streams still open then are cut.
	ShutdownTimeout time.Duration

	// Authenticate, when set, is called with every request but CORS
	// preflights, before anything reads its body. An error refuses the
	// request as unauthenticated (in the request's own protocol: a Connect,
	// gRPC or gRPC-Web error, else HTTP 401 with a JSON body), or with the
	// code of a *connect.Error it wraps, and the body is never read. The
	// answer's WWW-Authenticate header is the one in that error's metadata,
	// else Bearer realm="codemode". Otherwise the request goes on with the context it
	// returns, which may carry what it learnt (a tenant).
	Authenticate func(r *http.Request) (context.Context, error)

	// OnInvalid, when set, is called with the procedure of each request that
	// protovalidate refused (invalid_argument before the handler ran).
	OnInvalid func(procedure string)

	// TLS, when set, makes Serve speak TLS (HTTP/1.1 and HTTP/2 by ALPN),
	// and no plain HTTP; build it with tlsconfig.Server. Nil: plain HTTP/1.1
	// and HTTP/2 without TLS (h2c).
	TLS *tls.Config

	// Limits bound request bodies, connections and their timeouts (see
	// Limits). Set them before building handlers with HandlerOptions: the
	// message size limit is one of those options.
	Limits Limits
	turns  largeBodyTurns

	// Browsers, when set, refuses requests from web pages of other origins
	// and to host names the server does not answer to (see Browsers); set
	// it to a Browsers that passes Validate. Nil: pages of every origin may
	// call the server (each gets CORS headers allowing it), under any host
	// name.
	Browsers *Browsers
}

// New returns a Server that logs to logger. Every handler made with its
// HandlerOptions validates requests with protovalidate.
func New(logger *slog.Logger) *Server {
	s := &Server{
		logger:          logger,
		mux:             http.NewServeMux(),
		health:          grpchealth.NewStaticChecker(),
		ShutdownTimeout: DefaultShutdownTimeout,
	}
	s.opts = []connect.HandlerOption{connect.WithInterceptors(invalidCounter{s}, validate.NewInterceptor())}
	return s
}

// invalidCounter reports each request the validation refused to the
// server's OnInvalid.
type invalidCounter struct{ s *Server }

func (c invalidCounter) note(procedure string, err error) {
	var ve *protovalidate.ValidationError
	if err != nil && c.s.OnInvalid != nil && errors.As(err, &ve) {
		c.s.OnInvalid(procedure)
	}
}

func (c invalidCounter) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		c.note(req.Spec().Procedure, err)
		return res, err
	}
}

func (c invalidCounter) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (c invalidCounter) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		err := next(ctx, conn)
		c.note(conn.Spec().Procedure, err)
		return err
	}
}

// HandlerOptions returns the options every Connect handler of this server
// should be built with, followed by extra.
func (s *Server) HandlerOptions(extra ...connect.HandlerOption) []connect.HandlerOption {
	return append(append(append([]connect.HandlerOption(nil), s.opts...), s.Limits.connectOptions()...), extra...)
}

// HandleService mounts a generated Connect handler and registers the
// service for health checks and reflection.
func (s *Server) HandleService(path string, h http.Handler) {
	s.mux.Handle(path, s.rpcBody(h))
	name := strings.Trim(path, "/")
	s.services = append(s.services, name)
	s.health.SetStatus(name, grpchealth.StatusServing)
}

// Handle mounts a plain HTTP handler (MCP, the web page, seed-compatible
// endpoints) next to the Connect services.
func (s *Server) Handle(pattern string, h http.Handler) {
	s.mux.Handle(pattern, s.plainBody(h, refuseTooLarge))
}

// HandleTooLarge is Handle with refuse answering requests that declare a
// body over MaxRequestBytes, in the handler's own protocol (as MCP answers
// in JSON-RPC). refuse must write a 413.
func (s *Server) HandleTooLarge(pattern string, h http.Handler, refuse func(http.ResponseWriter, error)) {
	s.mux.Handle(pattern, s.plainBody(h, refuse))
}

// SetServing sets the health status of every registered service and of the
// server as a whole ("" in gRPC health terms).
func (s *Server) SetServing(serving bool) {
	st := grpchealth.StatusNotServing
	if serving {
		st = grpchealth.StatusServing
	}
	s.health.SetStatus("", st)
	for _, name := range s.services {
		s.health.SetStatus(name, st)
	}
}

// Handler returns the server's complete HTTP handler: services, health,
// reflection, and CORS for browsers on other origins (see Browsers).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", s.mux)
	mux.Handle(s.rpc(grpchealth.NewHandler(s.health, s.Limits.connectOptions()...)))
	names := append([]string{grpchealth.HealthV1ServiceName}, s.services...)
	reflector := grpcreflect.NewStaticReflector(names...)
	mux.Handle(s.rpc(grpcreflect.NewHandlerV1(reflector, s.Limits.connectOptions()...)))
	mux.Handle(s.rpc(grpcreflect.NewHandlerV1Alpha(reflector, s.Limits.connectOptions()...)))
	var check *browserCheck
	if s.Browsers != nil {
		check = s.Browsers.compile()
	}
	return withRequestID(s.withCORS(s.bodyDeadline(s.authenticated(mux)), check))
}

// authenticated runs Authenticate before h.
func (s *Server) authenticated(h http.Handler) http.Handler {
	if s.Authenticate == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, err := s.Authenticate(r)
		if err != nil {
			s.logger.Debug("request refused", "request_id", r.Header.Get(RequestIDHeader), "path", r.URL.Path, "remote", r.RemoteAddr, "error", err)
			var ce *connect.Error
			if !errors.As(err, &ce) {
				ce = connect.NewError(connect.CodeUnauthenticated, err)
			}
			challenge := ce.Meta().Get("WWW-Authenticate")
			if challenge == "" {
				challenge = `Bearer realm="codemode"`
			}
			ce.Meta().Del("WWW-Authenticate")
			w.Header().Set("WWW-Authenticate", challenge)
			WriteError(w, r, ce)
			return
		}
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// errorWriter writes errors in the protocol of the request.
var errorWriter = connect.NewErrorWriter()

// WriteError answers r with err: in its protocol if it is a Connect, gRPC
// or gRPC-Web call (a path /package.Service/Method), else as HTTP (the
// status Connect uses for err's code) with a JSON body {"error": message,
// "code": code}, the shape MCP clients and the seed's /run callers read.
func WriteError(w http.ResponseWriter, r *http.Request, err *connect.Error) {
	if isRPCPath(r.URL.Path) && errorWriter.IsSupported(r) {
		_ = errorWriter.Write(w, r, err)
		return
	}
	writeHTTPError(w, HTTPStatus(err.Code()), err)
}

// isRPCPath reports whether path names an RPC: /package.Service/Method.
func isRPCPath(path string) bool {
	svc, method, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	return ok && strings.Contains(svc, ".") && method != "" && !strings.Contains(method, "/")
}

// RequestIDHeader carries a request's id, in requests and responses.
const RequestIDHeader = "X-Request-Id"

// withRequestID gives every request an id: the caller's X-Request-Id when it
// is a plain token of at most 64 bytes, else a new random one. The id is set
// on the request (handlers read it there) and on the response, so that a
// caller can quote it when reporting a problem.
func withRequestID(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(RequestIDHeader)
		if !validRequestID(id) {
			id = NewRequestID()
			r.Header.Set(RequestIDHeader, id)
		}
		w.Header().Set(RequestIDHeader, id)
		h.ServeHTTP(w, r)
	})
}

// NewRequestID returns a random request id.
func NewRequestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func validRequestID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

// Serve serves on ln until ctx is done, then shuts down gracefully: it stops
// accepting, lets in-flight requests finish for up to ShutdownTimeout, and
// returns nil. It returns an error only when serving fails.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	if s.TLS != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true)
	}
	srv := &http.Server{
		Handler:           s.Handler(),
		Protocols:         &protocols,
		TLSConfig:         s.TLS,
		ReadHeaderTimeout: DefaultReadHeaderTimeout,
		IdleTimeout:       s.Limits.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	s.SetServing(true)
	errc := make(chan error, 1)
	scheme := "http"
	if s.TLS != nil {
		scheme = "https"
		// The certificate comes from TLSConfig.GetCertificate.
		go func() { errc <- srv.ServeTLS(s.Limits.listener(ln), "", "") }()
	} else {
		go func() { errc <- srv.Serve(s.Limits.listener(ln)) }()
	}
	s.logger.Info("listening", "addr", ln.Addr().String(), "scheme", scheme, "services", s.services)
	select {
	case err := <-errc:
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	s.SetServing(false)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(shutdownCtx)
	if errors.Is(err, context.DeadlineExceeded) {
		s.logger.Warn("shutdown timed out; closing open connections")
		err = srv.Close()
	}
	if e := <-errc; e != nil && !errors.Is(e, http.ErrServerClosed) {
		err = errors.Join(err, e)
	}
	return err
}
