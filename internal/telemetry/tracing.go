package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/otelconnect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Default service names, the resource attribute service.name of each
// service's spans unless OTEL_SERVICE_NAME says otherwise.
const (
	ServiceEdge         = "codemode-edge"
	ServiceControlPlane = "codemode-controlplane"
	ServiceAgent        = "codemode-agent"
)

// instrumentation names the tracer of codemode's own spans.
const instrumentation = "github.com/codemode-go/codemode"

// noopTracer and noopSpan stand in when tracing is off; they hold no state.
var (
	noopTracer = noop.NewTracerProvider().Tracer(instrumentation)
	noopSpan   = trace.SpanFromContext(context.Background())
)

// Span attributes codemode sets. They never carry code, stdin, file
// contents, output, API keys or the cluster secret.
const (
	AttrRequestID = attribute.Key("codemode.request_id")
	AttrDoor      = attribute.Key("codemode.door")
	AttrLanguage  = attribute.Key("codemode.language")
	AttrSession   = attribute.Key("codemode.session") // whether the run is in a session
	AttrAgent     = attribute.Key("codemode.agent")
	AttrOutcome   = attribute.Key("codemode.outcome")
	AttrExitCode  = attribute.Key("codemode.exit_code")
)

// Tracing is one process's OpenTelemetry tracing: spans exported over OTLP
// when the standard environment names an endpoint, nothing otherwise. A
// nil *Tracing is off: its options are empty, its Handler returns the
// handler it is given, and spans started with StartSpan under it are
// no-ops.
//
// Tracing never sets OpenTelemetry's global providers: each service passes
// its own down.
type Tracing struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	// trust says whether callers' trace context is taken as the parent of
	// this service's spans (the internal services) or only linked to (the
	// public edge, where any caller could otherwise choose trace ids and
	// sampling).
	trust bool
}

// TracingOption configures NewTracing.
type TracingOption func(*Tracing)

// TrustRemote makes callers' W3C trace context the parent of this
// service's server spans. Without it a caller's span is only linked, and
// every request starts a trace of its own. Internal services, whose
// callers hold the cluster secret, trust them.
func TrustRemote() TracingOption { return func(t *Tracing) { t.trust = true } }

// NewTracing reads OpenTelemetry's standard variables through getenv and
// returns the process's tracing, or nil (off) when no endpoint is set
// (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT),
// OTEL_SDK_DISABLED is true or OTEL_TRACES_EXPORTER is none.
//
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL chooses
// http/protobuf (the default) or grpc; service is the service.name unless
// OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say otherwise. The exporter
// reads the other OTEL_EXPORTER_OTLP_* variables (headers, timeout, TLS),
// and the SDK OTEL_TRACES_SAMPLER and OTEL_BSP_*, from the process's
// environment. Shutdown flushes what is left.
//
// # Errors
//
// An unknown protocol or exporter, or an exporter that cannot be built.
func NewTracing(ctx context.Context, service string, getenv func(string) string, opts ...TracingOption) (*Tracing, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "", "otlp":
	case "none":
		return nil, nil
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER %q: only otlp and none are supported", exp)
	}
	if getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" {
		return nil, nil
	}
	protocol := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var exporter sdktrace.SpanExporter
	var err error
	switch protocol {
	case "", "http/protobuf":
		exporter, err = otlptracehttp.New(ctx)
	case "grpc":
		exporter, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("OTLP protocol %q: want http/protobuf or grpc", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("trace resource: %w", err), exporter.Shutdown(ctx))
	}
	provider := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	t := &Tracing{
		provider: provider,
		tracer:   provider.Tracer(instrumentation),
		prop:     propagation.TraceContext{},
	}
	for _, o := range opts {
		o(t)
	}
	return t, nil
}

// StartTracing is how a service's Run starts tracing: NewTracing from the
// process's environment, a log line when spans are exported, and the stop
// that Run defers (ShutdownTracing).
func StartTracing(ctx context.Context, service string, log *slog.Logger, opts ...TracingOption) (*Tracing, func(), error) {
	t, err := NewTracing(ctx, service, os.Getenv, opts...)
	if err != nil {
		return nil, nil, err
	}
	if t.Enabled() {
		log.Info("exporting traces over OTLP")
	}
	return t, func() { ShutdownTracing(t, log) }, nil
}

// shutdownTimeout bounds the last export when a service stops.
const shutdownTimeout = 5 * time.Second

// ShutdownTracing is what a service's Run defers: Shutdown within a few
// seconds, logging a failure.
func ShutdownTracing(t *Tracing, log *slog.Logger) {
	if t == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := t.Shutdown(ctx); err != nil {
		log.Warn("export the last spans", "error", err)
	}
}

// Enabled reports whether spans are exported.
func (t *Tracing) Enabled() bool { return t != nil }

// Shutdown exports the spans not yet sent and stops the exporter; ctx
// bounds the wait.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// background reports whether procedure is a call services make on their
// own, every few hundred milliseconds, rather than for a request: agents'
// status polls and heartbeats. Tracing them would bury the traces of runs.
func background(procedure string) bool {
	return strings.HasSuffix(procedure, "/Status") || strings.HasSuffix(procedure, "/Heartbeat")
}

// interceptor returns the otelconnect interceptor of t's provider. Calls a
// client makes outside any trace (polls, heartbeats) start none.
func (t *Tracing) interceptor() connect.Interceptor {
	opts := []otelconnect.Option{
		otelconnect.WithTracerProvider(t.provider),
		otelconnect.WithPropagator(t.prop),
		otelconnect.WithoutMetrics(), // Prometheus has them
		otelconnect.WithFilter(func(ctx context.Context, spec connect.Spec) bool {
			if spec.IsClient {
				return trace.SpanContextFromContext(ctx).IsValid()
			}
			return !background(spec.Procedure)
		}),
	}
	if t.trust {
		opts = append(opts, otelconnect.WithTrustRemote())
	}
	i, err := otelconnect.NewInterceptor(opts...)
	if err != nil {
		// Only a meter's instruments can fail, and there are none.
		panic(fmt.Sprintf("otelconnect: %v", err))
	}
	return i
}

// HandlerOptions are the options that give a Connect handler server spans:
// none when t is off.
func (t *Tracing) HandlerOptions() []connect.HandlerOption {
	if t == nil {
		return nil
	}
	return []connect.HandlerOption{connect.WithInterceptors(t.interceptor())}
}

// ClientOptions are the options that give a Connect client's calls client
// spans and send their W3C trace context (traceparent): none when t is
// off. A call made outside any trace starts no span.
func (t *Tracing) ClientOptions() []connect.ClientOption {
	if t == nil {
		return nil
	}
	return []connect.ClientOption{connect.WithInterceptors(t.interceptor())}
}

// Handler wraps a plain HTTP door (MCP, POST /run) at route with a server
// span for each request, named "METHOD route", with the request id, method
// and status.
// It then writes the span's own trace context into the request's
// traceparent header, replacing the caller's, so that work that only
// sees the headers later (an MCP tool call) finds its parent. With t off
// it returns h.
func (t *Tracing) Handler(route string, h http.Handler) http.Handler {
	if t == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		opts := []trace.SpanStartOption{
			trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(
				semconv.HTTPRequestMethodKey.String(r.Method),
				semconv.URLPath(r.URL.Path),
				AttrRequestID.String(r.Header.Get("X-Request-Id")),
			),
		}
		if remote := t.prop.Extract(ctx, propagation.HeaderCarrier(r.Header)); trace.SpanContextFromContext(remote).IsValid() {
			if t.trust {
				ctx = remote
			} else {
				opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.LinkFromContext(remote)))
			}
		}
		ctx, span := t.tracer.Start(ctx, r.Method+" "+route, opts...)
		defer span.End()
		t.prop.Inject(ctx, propagation.HeaderCarrier(r.Header))
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r.WithContext(ctx))
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		span.SetAttributes(semconv.HTTPResponseStatusCode(sw.status))
		if sw.status >= 500 {
			span.SetStatus(codes.Error, http.StatusText(sw.status))
		}
	})
}

// ContextFromHeader returns ctx with the trace context that h carries as
// the remote parent of spans started from it; ctx as it is when h carries
// none or t is off. Handler put its span's context there.
func (t *Tracing) ContextFromHeader(ctx context.Context, h http.Header) context.Context {
	if t == nil || h == nil {
		return ctx
	}
	remote := t.prop.Extract(ctx, propagation.HeaderCarrier(h))
	if !trace.SpanContextFromContext(remote).IsValid() {
		return ctx
	}
	return remote
}

// Tracer is the tracer of codemode's own spans: a no-op one when t is off.
func (t *Tracing) Tracer() trace.Tracer {
	if t == nil {
		return noopTracer
	}
	return t.tracer
}

// statusWriter records the status a handler writes. It keeps Flush
// (server-sent events) and unwraps for http.ResponseController.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// StartSpan starts a span named name as a child of the span in ctx, with
// the tracer provider that made that span: a no-op span, at the cost of a
// context lookup, when ctx carries no recording span (tracing off, or a
// call outside any trace). Packages deep in a service use it so that no
// tracer has to be handed down to them.
func StartSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, noopSpan
	}
	return parent.TracerProvider().Tracer(instrumentation).Start(ctx, name, trace.WithAttributes(attrs...))
}

// EndSpan ends span, marking it failed with err's Connect code when err is
// not nil.
func EndSpan(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		span.SetStatus(codes.Error, connect.CodeOf(err).String())
	}
	span.End()
}

// Trace records e on the span in ctx (the service's span of the request):
// request id, door, language, whether it is in a session, agent, outcome
// and exit code. Never the session id itself, the tenant, the code or the
// output.
func (e *Execution) Trace(ctx context.Context) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	agent := e.Agent
	if agent == "" {
		agent = e.Result.GetAgent()
	}
	span.SetAttributes(
		AttrRequestID.String(e.RequestID),
		AttrLanguage.String(e.Language),
		AttrSession.Bool(e.SessionID != ""),
		AttrOutcome.String(e.Outcome()),
	)
	if e.Door != "" {
		span.SetAttributes(AttrDoor.String(e.Door))
	}
	if agent != "" {
		span.SetAttributes(AttrAgent.String(agent))
	}
	if e.Err == nil {
		span.SetAttributes(AttrExitCode.Int(int(e.Result.GetExitCode())))
	}
}
