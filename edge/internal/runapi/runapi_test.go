package runapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/edge/internal/execution"
	"github.com/codemode-go/codemode/edge/internal/tenant"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/runhttp"
	"github.com/codemode-go/codemode/internal/server"
)

// controlPlane stands in for the control plane: these tests are about the
// door, and need answers (refusals, hints, addresses) that a real cluster
// gives only with much setting up. The e2e tests run the door against real
// processes.
type controlPlane struct {
	controlplanev1connect.UnimplementedControlPlaneServiceHandler

	result *executionv1.Result
	err    error
	agents []*cpv1.Agent

	mu  sync.Mutex
	got []*cpv1.ExecuteRequest
}

func (c *controlPlane) Execute(_ context.Context, req *connect.Request[cpv1.ExecuteRequest]) (*connect.Response[cpv1.ExecuteResponse], error) {
	c.mu.Lock()
	c.got = append(c.got, req.Msg)
	c.mu.Unlock()
	if c.err != nil {
		return nil, c.err
	}
	return connect.NewResponse(&cpv1.ExecuteResponse{Result: c.result}), nil
}

// ListLanguages lists a table, as agents would report it.
func (c *controlPlane) ListLanguages(context.Context, *connect.Request[cpv1.ListLanguagesRequest]) (*connect.Response[cpv1.ListLanguagesResponse], error) {
	var langs []*executionv1.Language
	for _, name := range []string{"python", "bash"} {
		langs = append(langs, &executionv1.Language{Name: name})
	}
	return connect.NewResponse(&cpv1.ListLanguagesResponse{Languages: langs, Defaults: &executionv1.Defaults{Language: "python"}}), nil
}

func (c *controlPlane) ListAgents(context.Context, *connect.Request[cpv1.ListAgentsRequest]) (*connect.Response[cpv1.ListAgentsResponse], error) {
	return connect.NewResponse(&cpv1.ListAgentsResponse{Agents: c.agents}), nil
}

func (c *controlPlane) last(t *testing.T) *cpv1.ExecuteRequest {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.got) == 0 {
		t.Fatal("the control plane got no Execute")
	}
	return c.got[len(c.got)-1]
}

// service returns an execution.Service in front of cp served over real
// HTTP; a nil cp is a control plane that cannot be reached.
func service(t *testing.T, cp *controlPlane) *execution.Service {
	t.Helper()
	var url string
	if cp == nil {
		srv := httptest.NewServer(http.NotFoundHandler())
		url = srv.URL
		srv.Close()
	} else {
		mux := http.NewServeMux()
		mux.Handle(controlplanev1connect.NewControlPlaneServiceHandler(cp))
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		url = srv.URL
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	return execution.New(controlplanev1connect.NewControlPlaneServiceClient(http.DefaultClient, url), logger)
}

// serve calls h as the edge does after authentication: with a request id
// and, unless tn is empty, the tenant tn in the request's context. A body
// is sent as application/json.
func serve(h http.Handler, tn, method, path, body string) *httptest.ResponseRecorder {
	return serveAs(h, tn, method, path, "application/json", body)
}

// serveAs is serve with the body sent as contentType ("": no Content-Type).
func serveAs(h http.Handler, tn, method, path, contentType, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Header.Set(server.RequestIDHeader, "req-1")
	if contentType != "" && body != "" {
		r.Header.Set("Content-Type", contentType)
	}
	if tn != "" {
		r = r.WithContext(tenant.NewContext(r.Context(), tn))
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func decode[T any](t *testing.T, w *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("decode %q: %v", w.Body.String(), err)
	}
	return v
}

func TestRunHandler(t *testing.T) {
	t.Parallel()
	retry := connect.NewError(connect.CodeResourceExhausted, errors.New("tenant team-a is over its limit of 4 runs at once"))
	retry.Meta().Set("Retry-After", "2")
	cases := []struct {
		name     string
		cp       *controlPlane // nil: unreachable
		method   string
		body     string
		noTenant bool
		status   int
		want     runhttp.RunResponse
		header   map[string]string
		lang     string // the language the control plane must get
	}{
		{
			name: "result", cp: &controlPlane{result: &executionv1.Result{Stdout: "42\n"}},
			body:   `{"code":"print(6*7)","language":"python","sessionId":""}`,
			status: http.StatusOK, want: runhttp.RunResponse{Output: "42\n"}, lang: "python",
		},
		{
			name: "language defaults to python", cp: &controlPlane{result: &executionv1.Result{}},
			body: `{"code":"print(1)"}`, status: http.StatusOK, lang: "python",
		},
		{
			name: "language is lower-cased", cp: &controlPlane{result: &executionv1.Result{}},
			body: `{"code":"echo 1","language":" BASH "}`, status: http.StatusOK, lang: "bash",
		},
		{
			name: "failing program is a result", cp: &controlPlane{result: &executionv1.Result{Stderr: "boom", ExitCode: 3, Truncated: true}},
			body: `{"code":"x","language":"python"}`, status: http.StatusOK,
			want: runhttp.RunResponse{Error: "boom\nexit status 3\noutput truncated", ExitCode: 3, Truncated: true}, lang: "python",
		},
		{
			name: "policy denial is 403", cp: &controlPlane{err: connect.NewError(connect.CodePermissionDenied, errors.New(`denied by policy "x": no`))},
			body: `{"code":"x"}`, status: http.StatusForbidden, want: runhttp.RunResponse{Error: `denied by policy "x": no`, ExitCode: -1},
		},
		{
			name: "rate refusal is 429 with Retry-After", cp: &controlPlane{err: retry},
			body: `{"code":"x"}`, status: http.StatusTooManyRequests,
			want:   runhttp.RunResponse{Error: "tenant team-a is over its limit of 4 runs at once", ExitCode: -1},
			header: map[string]string{"Retry-After": "2"},
		},
		{
			name: "invalid language is 400", cp: &controlPlane{},
			body: `{"code":"x","language":"cobol"}`, status: http.StatusBadRequest,
		},
		{
			name: "invalid JSON is 400", cp: &controlPlane{},
			body: `{"code":`, status: http.StatusBadRequest,
		},
		{
			name: "oversized body is 413", cp: &controlPlane{},
			body: `{"code":"` + strings.Repeat("x", runhttp.MaxRunBody) + `"}`, status: http.StatusRequestEntityTooLarge,
		},
		{
			name: "GET is 405", cp: &controlPlane{}, method: http.MethodGet,
			status: http.StatusMethodNotAllowed, header: map[string]string{"Allow": "POST"},
		},
		{
			name: "no tenant is 500", cp: &controlPlane{}, noTenant: true,
			body: `{"code":"x"}`, status: http.StatusInternalServerError,
		},
		{
			name: "unreachable control plane is 503", body: `{"code":"x"}`, status: http.StatusServiceUnavailable,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			method, tn := tc.method, "team-a"
			if method == "" {
				method = http.MethodPost
			}
			if tc.noTenant {
				tn = ""
			}
			w := serve(RunHandler(service(t, tc.cp)), tn, method, "/run", tc.body)
			if w.Code != tc.status {
				t.Fatalf("HTTP %d %s, want %d", w.Code, w.Body, tc.status)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			got := decode[runhttp.RunResponse](t, w)
			switch {
			case tc.status != http.StatusOK && (got.ExitCode != -1 || got.Output != "" || got.Error == ""):
				t.Errorf("refusal %+v, want empty output, an error and exit code -1", got)
			case tc.want != (runhttp.RunResponse{}) && got != tc.want:
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			for k, v := range tc.header {
				if w.Header().Get(k) != v {
					t.Errorf("header %s = %q, want %q", k, w.Header().Get(k), v)
				}
			}
			if strings.Contains(w.Body.String(), "127.0.0.1") {
				t.Errorf("answer %s names an internal address", w.Body)
			}
			if tc.lang != "" {
				req := tc.cp.last(t)
				if req.GetExecution().GetLanguage() != tc.lang || req.GetTenant() != "team-a" || req.GetRequestId() != "req-1" {
					t.Errorf("control plane got %v, want language %s, tenant team-a, request id req-1", req, tc.lang)
				}
			}
		})
	}
}

// TestRunHandlerWantsJSON checks that /run runs only a body sent as
// application/json: the body types a web page can send to another origin
// without a CORS preflight (text/plain, forms) never reach the control
// plane.
func TestRunHandlerWantsJSON(t *testing.T) {
	t.Parallel()
	const body = `{"code":"print(6*7)","language":"python"}`
	for _, tc := range []struct {
		contentType string
		status      int
	}{
		{"application/json", http.StatusOK},
		{"application/json; charset=utf-8", http.StatusOK},
		{"Application/JSON", http.StatusOK},
		{"text/plain", http.StatusUnsupportedMediaType},
		{"text/plain;charset=UTF-8", http.StatusUnsupportedMediaType},
		{"application/x-www-form-urlencoded", http.StatusUnsupportedMediaType},
		{"multipart/form-data; boundary=x", http.StatusUnsupportedMediaType},
		{"application/jsonx", http.StatusUnsupportedMediaType},
		{"", http.StatusUnsupportedMediaType},
	} {
		t.Run(tc.contentType, func(t *testing.T) {
			t.Parallel()
			cp := &controlPlane{result: &executionv1.Result{Stdout: "42\n"}}
			w := serveAs(RunHandler(service(t, cp)), "team-a", http.MethodPost, "/run", tc.contentType, body)
			if w.Code != tc.status {
				t.Fatalf("Content-Type %q: HTTP %d %s, want %d", tc.contentType, w.Code, w.Body, tc.status)
			}
			cp.mu.Lock()
			ran := len(cp.got)
			cp.mu.Unlock()
			if want := tc.status == http.StatusOK; (ran > 0) != want {
				t.Fatalf("Content-Type %q: the control plane got %d runs, want a run %v", tc.contentType, ran, want)
			}
			if got := decode[runhttp.RunResponse](t, w); tc.status != http.StatusOK && (got.ExitCode != -1 || got.Error == "") {
				t.Errorf("refusal %+v, want an error and exit code -1", got)
			}
		})
	}
}

func TestRunHandlerScopesSessions(t *testing.T) {
	t.Parallel()
	cp := &controlPlane{result: &executionv1.Result{}}
	h := RunHandler(service(t, cp))
	var ids []string
	for _, tn := range []string{"team-a", "team-b"} {
		if w := serve(h, tn, http.MethodPost, "/run", `{"code":"x = 1","sessionId":"mine"}`); w.Code != http.StatusOK {
			t.Fatalf("HTTP %d %s", w.Code, w.Body)
		}
		ids = append(ids, cp.last(t).GetExecution().GetSessionId())
	}
	if ids[0] == "" || ids[0] == "mine" || ids[0] == ids[1] {
		t.Fatalf("session ids sent for two tenants' %q: %q, want two different scoped ids", "mine", ids)
	}
}

func TestStatusHandler(t *testing.T) {
	t.Parallel()
	py := &executionv1.Language{Name: "python", Version: "3.11", Preloaded: []string{"numpy", "pandas"}}
	js := &executionv1.Language{Name: "javascript", Version: "18"}
	agents := []*cpv1.Agent{
		{Address: "127.0.0.7:30031", Healthy: true, InFlight: 1,
			Status: &agentv1.AgentStatus{Name: "vm-1", Warm: 2, Busy: 1, Sessions: 3, Capacity: 8, Free: 2, Languages: []*executionv1.Language{py, js},
				TenantSessions: map[string]int32{"team-a": 1, "team-b": 2}}},
		{Address: "127.0.0.6:30032", Healthy: false, Error: "dial tcp 127.0.0.6:30032: connection refused",
			Status: &agentv1.AgentStatus{Name: "vm-2", Languages: []*executionv1.Language{{Name: "bash"}}}},
	}
	t.Run("ok", func(t *testing.T) {
		statusOK(t, agents)
	})
	t.Run("each tenant sees its own sessions and no load", func(t *testing.T) {
		t.Parallel()
		h := StatusHandler(service(t, &controlPlane{agents: agents}))
		for tn, want := range map[string]float64{"team-a": 1, "team-b": 2, "team-c": 0} {
			w := serve(h, tn, http.MethodGet, "/status", "")
			var got struct {
				Sessions float64
				Agents   []map[string]any
			}
			if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != http.StatusOK {
				t.Fatalf("%s: HTTP %d %s: %v", tn, w.Code, w.Body, err)
			}
			if got.Sessions != want || len(got.Agents) != 2 || got.Agents[0]["sessions"] != want {
				t.Errorf("%s: status %s, want its own %v sessions", tn, w.Body, want)
			}
			for _, load := range []string{"busy", "warm", "free"} {
				if _, ok := got.Agents[0][load]; ok {
					t.Errorf("%s: status %s shows the agent's %s sandboxes", tn, w.Body, load)
				}
			}
		}
	})
	t.Run("no healthy agent is 503", func(t *testing.T) {
		t.Parallel()
		w := serve(StatusHandler(service(t, &controlPlane{agents: agents[1:]})), "team-a", http.MethodGet, "/status", "")
		if got := decode[Status](t, w); w.Code != http.StatusServiceUnavailable || got.Status != "unavailable" || len(got.Agents) != 1 || len(got.Languages) != 0 {
			t.Fatalf("HTTP %d %s, want 503 unavailable with one agent and no languages", w.Code, w.Body)
		}
	})
	t.Run("unreachable control plane is 503", func(t *testing.T) {
		t.Parallel()
		w := serve(StatusHandler(service(t, nil)), "team-a", http.MethodGet, "/status", "")
		got := decode[Status](t, w)
		if w.Code != http.StatusServiceUnavailable || got.Status != "unavailable" || got.Error == "" || got.Agents == nil {
			t.Fatalf("HTTP %d %s, want 503 unavailable with an error", w.Code, w.Body)
		}
		if strings.Contains(w.Body.String(), "127.0.0.1") {
			t.Errorf("status %s names an internal address", w.Body)
		}
	})
	t.Run("POST is 405", func(t *testing.T) {
		t.Parallel()
		w := serve(StatusHandler(service(t, &controlPlane{})), "team-a", http.MethodPost, "/status", "")
		if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, HEAD" {
			t.Fatalf("HTTP %d Allow %q, want 405 with GET, HEAD", w.Code, w.Header().Get("Allow"))
		}
	})
	t.Run("no tenant is 500", func(t *testing.T) {
		t.Parallel()
		w := serve(StatusHandler(service(t, &controlPlane{agents: agents})), "", http.MethodGet, "/status", "")
		if w.Code != http.StatusInternalServerError {
			t.Fatalf("HTTP %d, want 500", w.Code)
		}
	})
}

// statusOK is TestStatusHandler's "ok": the status of agents, nothing internal in it.
func statusOK(t *testing.T, agents []*cpv1.Agent) {
	t.Parallel()
	w := serve(StatusHandler(service(t, &controlPlane{agents: agents})), "team-a", http.MethodGet, "/status", "")
	if w.Code != http.StatusOK {
		t.Fatalf("HTTP %d %s", w.Code, w.Body)
	}
	for _, secret := range []string{"127.0.0.", "3003", "dial", "refused"} {
		if strings.Contains(w.Body.String(), secret) {
			t.Errorf("status %s reveals %q", w.Body, secret)
		}
	}
	got := decode[Status](t, w)
	want := Status{Status: "ok", HealthyAgents: 1,
		Agents: []Agent{
			{Name: "vm-1", Healthy: true, Sessions: 1, Capacity: 8},
			{Name: "vm-2"},
		},
		Sessions:  1,
		Languages: []Language{{Name: "javascript", Version: "18"}, {Name: "python", Version: "3.11", Preloaded: []string{"numpy", "pandas"}}},
	}
	gotJSON, _ := json.Marshal(got)
	wantJSON, _ := json.Marshal(want)
	if string(gotJSON) != string(wantJSON) {
		t.Errorf("status\n got %s\nwant %s", gotJSON, wantJSON)
	}
}
