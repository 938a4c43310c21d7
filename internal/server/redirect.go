package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// RedirectHTTPS answers every request with a permanent redirect to the same
// host, path and query over https on port (left out of the URL when it is
// 443). 308 keeps the method and body, so a client that follows it sends
// the same request over TLS; nothing of the request is served in clear. A
// request without a valid host name gets 400.
func RedirectHTTPS(port string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		if host == "" || !validHost(host) {
			http.Error(w, "plain HTTP is redirected to https: the request names no valid host", http.StatusBadRequest)
			return
		}
		if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
			host = "[" + host + "]"
		}
		if port != "443" {
			host += ":" + port
		}
		w.Header().Set("Connection", "close")
		http.Redirect(w, r, "https://"+host+r.URL.RequestURI(), http.StatusPermanentRedirect)
	})
}

// validHost reports whether h is an IP address or a host name of letters,
// digits, hyphens and dots.
func validHost(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	if len(h) > 253 {
		return false
	}
	for _, c := range h {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.':
		default:
			return false
		}
	}
	return true
}

// ServeRedirect serves RedirectHTTPS(port) on ln until ctx ends, logging
// where, and returns once it has stopped.
func ServeRedirect(ctx context.Context, ln net.Listener, port string, logger *slog.Logger) error {
	srv := &http.Server{
		Handler:           RedirectHTTPS(port),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	logger.Info("redirecting plain HTTP to https", "addr", ln.Addr().String(), "https_port", port)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case <-ctx.Done():
		shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
		return nil
	case err := <-done:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}
