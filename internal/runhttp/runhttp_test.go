package runhttp

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
)

// The handlers are tested here with plain functions for the run and the
// status; edge/internal/runapi and the control plane's tests run them over
// their real services.

func TestRunHandlerContentType(t *testing.T) {
	t.Parallel()
	run := func(_ context.Context, ex *executionv1.Execution, _ string) (*executionv1.Result, error) {
		return &executionv1.Result{Stdout: ex.GetLanguage()}, nil
	}
	for _, tc := range []struct {
		name        string
		opts        []RunOption
		contentType string
		status      int
	}{
		{"json", nil, "application/json", http.StatusOK},
		{"text", nil, "text/plain", http.StatusUnsupportedMediaType},
		{"none", nil, "", http.StatusUnsupportedMediaType},
		{"text, any content type", []RunOption{AnyContentType()}, "text/plain", http.StatusOK},
		{"none, any content type", []RunOption{AnyContentType()}, "", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := httptest.NewRequest(http.MethodPost, "/run", strings.NewReader(`{"code":"x","language":" Bash "}`))
			if tc.contentType != "" {
				r.Header.Set("Content-Type", tc.contentType)
			}
			w := httptest.NewRecorder()
			RunHandler(run, tc.opts...).ServeHTTP(w, r)
			if w.Code != tc.status {
				t.Fatalf("HTTP %d %s, want %d", w.Code, w.Body, tc.status)
			}
			var got RunResponse
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if tc.status == http.StatusOK && got.Output != "bash" {
				t.Errorf("ran language %q, want bash", got.Output)
			}
		})
	}
}

func TestStatusHandler(t *testing.T) {
	t.Parallel()
	limited := connect.NewError(connect.CodeResourceExhausted, errors.New("slow down"))
	limited.Meta().Set("Retry-After", "3")
	for _, tc := range []struct {
		name       string
		healthy    bool
		err        error
		status     int
		retryAfter string
	}{
		{"healthy", true, nil, http.StatusOK, ""},
		{"no healthy agent", false, nil, http.StatusServiceUnavailable, ""},
		{"unavailable", true, connect.NewError(connect.CodeUnavailable, errors.New("down")), http.StatusServiceUnavailable, ""},
		{"limited", false, limited, http.StatusTooManyRequests, "3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := StatusHandler(func(_ context.Context, requestID string) (any, bool, error) {
				return map[string]string{"requestId": requestID}, tc.healthy, tc.err
			})
			r := httptest.NewRequest(http.MethodGet, "/status", nil)
			r.Header.Set(server.RequestIDHeader, "req-1")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.status || w.Header().Get("Retry-After") != tc.retryAfter || !strings.Contains(w.Body.String(), `"requestId":"req-1"`) {
				t.Fatalf("HTTP %d Retry-After %q %s, want %d Retry-After %q with the report", w.Code, w.Header().Get("Retry-After"), w.Body, tc.status, tc.retryAfter)
			}
		})
	}
}
