package telemetry

import (
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	collectorv1 "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

type okHandler struct{}

func (*okHandler) ServeHTTP(http.ResponseWriter, *http.Request) {}

func TestNewTracingOff(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"no endpoint", map[string]string{"OTEL_SERVICE_NAME": "x", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}},
		{"sdk disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}},
		{"exporter none", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces", "OTEL_TRACES_EXPORTER": "none"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tr, err := NewTracing(t.Context(), ServiceEdge, func(k string) string { return tc.env[k] })
			if err != nil {
				t.Fatalf("NewTracing: %v", err)
			}
			if tr.Enabled() {
				t.Fatal("tracing is on")
			}
			if len(tr.HandlerOptions()) != 0 || len(tr.ClientOptions()) != 0 {
				t.Error("tracing off installs interceptors")
			}
			h := &okHandler{}
			if got := tr.Handler("/run", h); got != http.Handler(h) {
				t.Error("tracing off wraps HTTP handlers")
			}
			if _, span := StartSpan(t.Context(), "x"); span.IsRecording() {
				t.Error("a span records with tracing off")
			}
			if err := tr.Shutdown(t.Context()); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestNewTracingErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
	}{
		{"json", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}},
		{"zipkin", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_TRACES_EXPORTER": "zipkin"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := NewTracing(t.Context(), ServiceEdge, func(k string) string { return tc.env[k] }); err == nil {
				t.Fatal("NewTracing accepted it")
			}
		})
	}
}

// receiver is an OTLP/HTTP trace receiver on loopback.
type receiver struct {
	mu    sync.Mutex
	spans []*tracev1.Span
	names []string // service.name of each span
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, _ := io.ReadAll(req.Body)
	var ex collectorv1.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &ex); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range ex.GetResourceSpans() {
		var name string
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				name = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.spans = append(r.spans, sp)
				r.names = append(r.names, name)
			}
		}
	}
}

// TestTracingHandler serves a plain HTTP door with tracing on, exporting to
// a receiver on loopback, and checks the door's span: its name, request
// id and service name; a caller's traceparent is linked but not the parent
// unless the service trusts its callers; the span's own context replaces
// the caller's in the request header, where later work finds its parent;
// StartSpan makes children of the span in the request's context.
func TestTracingHandler(t *testing.T) {
	rec := &receiver{}
	srv := httptest.NewServer(rec)
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	const callerTrace = "0af7651916cd43dd8448eb211c80319c"
	const callerParent = "00f067aa0ba902b7-01"
	for _, trust := range []bool{false, true} {
		var opts []TracingOption
		if trust {
			opts = append(opts, TrustRemote())
		}
		tr, err := NewTracing(context.Background(), ServiceAgent, func(k string) string {
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": srv.URL}[k]
		}, opts...)
		if err != nil || !tr.Enabled() {
			t.Fatalf("NewTracing: %v, enabled %v", err, tr.Enabled())
		}
		var seen string
		h := tr.Handler("/run", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen = r.Header.Get("traceparent")
			_, span := tr.Tracer().Start(tr.ContextFromHeader(context.Background(), r.Header), "child")
			span.End()
			_, inner := StartSpan(r.Context(), "inner")
			inner.End()
			w.WriteHeader(http.StatusTeapot)
		}))
		req := httptest.NewRequest(http.MethodPost, "/run", nil)
		req.Header.Set("traceparent", "00-"+callerTrace+"-"+callerParent)
		req.Header.Set("X-Request-Id", "req-1")
		h.ServeHTTP(httptest.NewRecorder(), req)
		if err := tr.Shutdown(context.Background()); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		rec.mu.Lock()
		spans, names := rec.spans, rec.names
		rec.spans, rec.names = nil, nil
		rec.mu.Unlock()
		if len(spans) != 3 {
			t.Fatalf("trust %v: %d spans exported, want 3", trust, len(spans))
		}
		child, inner, door := spans[0], spans[1], spans[2]
		if door.GetName() != "POST /run" || names[2] != ServiceAgent {
			t.Errorf("door span %q of %q", door.GetName(), names[2])
		}
		for _, sp := range []*tracev1.Span{child, inner} {
			if string(sp.GetParentSpanId()) != string(door.GetSpanId()) || string(sp.GetTraceId()) != string(door.GetTraceId()) {
				t.Errorf("span %q is not the door span's child", sp.GetName())
			}
		}
		if seen == "00-"+callerTrace+"-"+callerParent {
			t.Error("the handler saw the caller's traceparent, not the door span's")
		}
		var id string
		var status int64
		for _, kv := range door.GetAttributes() {
			switch kv.GetKey() {
			case string(AttrRequestID):
				id = kv.GetValue().GetStringValue()
			case "http.response.status_code":
				status = kv.GetValue().GetIntValue()
			}
		}
		if id != "req-1" || status != http.StatusTeapot {
			t.Errorf("door span request id %q status %d", id, status)
		}
		fromCaller := hexOf(door.GetTraceId()) == callerTrace
		if fromCaller != trust {
			t.Errorf("trust %v: the door span continues the caller's trace: %v", trust, fromCaller)
		}
		if !trust && (len(door.GetLinks()) != 1 || hexOf(door.GetLinks()[0].GetTraceId()) != callerTrace) {
			t.Errorf("the untrusted caller's span is not linked: %v", door.GetLinks())
		}
	}
}

func hexOf(b []byte) string { return hex.EncodeToString(b) }
