package server

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestRedirectHTTPS(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		port, method, host, target, want string
		code                             int
	}{
		{"8443", http.MethodGet, "edge.example:80", "/mcp?x=1", "https://edge.example:8443/mcp?x=1", http.StatusPermanentRedirect},
		{"443", http.MethodPost, "edge.example", "/run", "https://edge.example/run", http.StatusPermanentRedirect},
		{"443", http.MethodGet, "[::1]:80", "/", "https://[::1]/", http.StatusPermanentRedirect},
		{"8443", http.MethodGet, "127.0.0.1", "/a/b", "https://127.0.0.1:8443/a/b", http.StatusPermanentRedirect},
		{"443", http.MethodGet, "", "/", "", http.StatusBadRequest},
		{"443", http.MethodGet, "evil.example/@other", "/", "", http.StatusBadRequest},
	} {
		req := httptest.NewRequest(tc.method, "http://placeholder"+tc.target, nil)
		req.Host = tc.host
		rec := httptest.NewRecorder()
		RedirectHTTPS(tc.port).ServeHTTP(rec, req)
		if rec.Code != tc.code || rec.Header().Get("Location") != tc.want {
			t.Errorf("%s %s%s: %d %q, want %d %q", tc.method, tc.host, tc.target, rec.Code, rec.Header().Get("Location"), tc.code, tc.want)
		}
	}
}
