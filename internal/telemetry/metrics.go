package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/cluster"
	"github.com/codemode-go/codemode/internal/version"
)

// latencyBuckets suit runs: from a millisecond to two minutes.
var latencyBuckets = prometheus.ExponentialBucketsRange(0.001, 120, 16)

// Metrics are one process's Prometheus metrics, in a registry of its own
// (never the global one). A nil *Metrics records nothing, so that parts
// built without metrics (tests) need no checks.
type Metrics struct {
	// Registry holds every metric of the process; a service adds its own
	// collectors to it.
	Registry *prometheus.Registry

	executions *prometheus.CounterVec
	toolCalls  *prometheus.CounterVec
	invalid    *prometheus.CounterVec
	elapsed    *prometheus.HistogramVec
	runtime    *prometheus.HistogramVec
	queueWait  prometheus.Histogram
}

// NewMetrics returns the metrics of a process, with Go runtime and process
// collectors and the execution metrics every service records:
//
//   - codemode_executions_total{door,language,outcome}: executions ended;
//   - codemode_execution_seconds{door,language}: end to end, as this
//     service saw each execution;
//   - codemode_run_seconds{language}: the program's own run time, from its
//     result;
//   - codemode_queue_wait_seconds: time waiting for a sandbox (agent);
//   - codemode_build_info{version,commit,goversion}: 1, saying which build
//     runs (see package version);
//   - codemode_mcp_tool_calls_total{door,tool,outcome}: MCP tool calls
//     (edge);
//   - codemode_requests_invalid_total{procedure}: requests refused before
//     anything ran because they failed validation.
//
// No metric has a tenant label: a tenant's name is theirs, and tenants are
// many.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		executions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "codemode_executions_total",
			Help: "Executions ended, by door, language and outcome (ok, exit, timed_out, oom, or the error's Connect code).",
		}, []string{"door", "language", "outcome"}),
		elapsed: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "codemode_execution_seconds",
			Help:    "Time from receiving an execution to its end, as this service saw it.",
			Buckets: latencyBuckets,
		}, []string{"door", "language"}),
		runtime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "codemode_run_seconds",
			Help:    "Time the program ran, from the start of the program to its end.",
			Buckets: latencyBuckets,
		}, []string{"language"}),
		queueWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "codemode_queue_wait_seconds",
			Help:    "Time a stateless run waited for a warm sandbox.",
			Buckets: latencyBuckets,
		}),
		toolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "codemode_mcp_tool_calls_total",
			Help: "MCP tool calls ended, by door (mcp, mcp-no-code-execute), tool and outcome (ok, tool_error, or the error's Connect code).",
		}, []string{"door", "tool", "outcome"}),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "codemode_requests_invalid_total",
			Help: "Requests refused with invalid_argument before anything ran, by procedure.",
		}, []string{"procedure"}),
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "codemode_build_info",
		Help:        "Always 1: the build of this process, in its labels.",
		ConstLabels: prometheus.Labels{"version": version.Version(), "commit": version.Commit(), "goversion": runtime.Version()},
	})
	build.Set(1)
	m.Registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.executions, m.elapsed, m.runtime, m.queueWait, m.toolCalls, m.invalid, build,
	)
	return m
}

// ObserveToolCall counts an MCP tool call at door that ended with outcome.
func (m *Metrics) ObserveToolCall(door, tool, outcome string) {
	if m == nil {
		return
	}
	m.toolCalls.WithLabelValues(door, tool, outcome).Inc()
}

// ObserveInvalid counts a request to procedure refused by validation.
func (m *Metrics) ObserveInvalid(procedure string) {
	if m == nil {
		return
	}
	m.invalid.WithLabelValues(procedure).Inc()
}

// ObserveExecution records e.
func (m *Metrics) ObserveExecution(e *Execution) {
	if m == nil {
		return
	}
	m.executions.WithLabelValues(e.Door, e.Language, e.Outcome()).Inc()
	m.elapsed.WithLabelValues(e.Door, e.Language).Observe(e.Elapsed.Seconds())
	if e.Err == nil && e.Result.GetDuration() != nil {
		m.runtime.WithLabelValues(e.Language).Observe(e.Result.GetDuration().AsDuration().Seconds())
	}
}

// ObserveQueueWait records a wait for a sandbox.
func (m *Metrics) ObserveQueueWait(d time.Duration) {
	if m == nil {
		return
	}
	m.queueWait.Observe(d.Seconds())
}

// MustRegister adds a service's own collectors.
func (m *Metrics) MustRegister(cs ...prometheus.Collector) {
	if m == nil {
		return
	}
	m.Registry.MustRegister(cs...)
}

// MetricsFlags defines --metrics-addr (env METRICS_ADDR) on f and returns
// its value: where to serve /metrics, empty for nowhere.
func MetricsFlags(f *cli.Flags) *string {
	addr := f.String("metrics-addr", "", "loopback address to serve Prometheus metrics on, at /metrics (e.g. 127.0.0.1:9090; a bare port binds 127.0.0.1); empty: not served")
	f.Env("metrics-addr", "METRICS_ADDR")
	return addr
}

// ListenMetrics opens the listener for /metrics on addr, which must be on
// loopback: metrics describe the whole service (languages, agents, load)
// and are served without authentication, so they stay on the host; a
// scraper elsewhere goes through something on the host that it trusts.
func ListenMetrics(ctx context.Context, addr string) (net.Listener, error) {
	a, err := cluster.LoopbackAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("metrics-addr: %w (metrics are served on loopback only)", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", a)
	if err != nil {
		return nil, fmt.Errorf("metrics-addr: %w", err)
	}
	return ln, nil
}

// ServeMetrics serves m's registry at /metrics on ln until ctx is done.
// It logs "serving metrics" with the address once it accepts.
func (m *Metrics) ServeMetrics(ctx context.Context, ln net.Listener, log *slog.Logger) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("serving metrics", "addr", ln.Addr().String())
	select {
	case err := <-errc:
		return fmt.Errorf("serve metrics: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if e := <-errc; e != nil && !errors.Is(e, http.ErrServerClosed) {
		err = errors.Join(err, e)
	}
	return err
}

// StartMetrics is what a service's Run does with --metrics-addr: nothing
// when addr is empty, else listen (an error here stops the start) and serve
// in the background until ctx is done.
func (m *Metrics) StartMetrics(ctx context.Context, addr string, log *slog.Logger) error {
	if addr == "" {
		return nil
	}
	ln, err := ListenMetrics(ctx, addr)
	if err != nil {
		return err
	}
	go func() {
		if err := m.ServeMetrics(ctx, ln, log); err != nil {
			log.Error("metrics server stopped", "error", err)
		}
	}()
	return nil
}
