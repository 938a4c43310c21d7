// Package controlplaned is the control plane's program: configuration, the
// ControlPlaneService, and the original coderunner's POST /run and GET
// /status, all on one port.
package controlplaned

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/codemode-go/codemode/controlplane/internal/redisstore"
	"github.com/codemode-go/codemode/controlplane/internal/router"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/cluster"
	"github.com/codemode-go/codemode/internal/runhttp"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/telemetry"
	"github.com/codemode-go/codemode/internal/tlsconfig"
)

// Config is the control plane's configuration.
type Config struct {
	// Addr to listen on for gRPC, gRPC-Web, Connect and the original's POST /run and GET /status.
	Addr string
	// Agents are the agents' addresses, host:port. A name is resolved
	// again every ResolveInterval, each of its addresses an agent. Agents
	// may also join by themselves (their --controlplanes flag).
	Agents []string
	// PollInterval is how often configured agents' status is read.
	PollInterval time.Duration
	// ResolveInterval is how often names in Agents are resolved again.
	ResolveInterval time.Duration
	// Secret authenticates the edges' calls and this control plane's calls
	// to the agents; nil: none, and the control plane serves on loopback only.
	Secret *cluster.Secret
	// Links are how the control plane calls the agents: with Secret, over
	// TLS with a cluster CA (see cluster.Links). Nil: plain h2c.
	Links *cluster.Links
	// TLS are the certificate and key the control plane serves HTTPS with;
	// empty: plain HTTP.
	TLS tlsconfig.Files
	// MetricsAddr is the loopback address to serve Prometheus metrics on,
	// at /metrics; empty: none.
	MetricsAddr string
	// Tracing exports the control plane's spans (see
	// telemetry.NewTracing); nil: none.
	Tracing *telemetry.Tracing
	// RedisURL, when set, is the Redis that keeps session bindings,
	// tombstones and agents' heartbeats for every control plane sharing
	// it (see controlplane/internal/redisstore); empty: this control
	// plane's memory, for one replica. Its records are sealed with a key
	// derived from Secret, so every control plane sharing it needs the
	// same secret.
	RedisURL string
	// RedisPrefix starts every key in Redis.
	RedisPrefix string
}

// Defaults.
const (
	DefaultAddr            = ":8080" // 127.0.0.1:8080 without a cluster secret
	DefaultAgents          = "127.0.0.1:30031"
	DefaultPollInterval    = 500 * time.Millisecond
	DefaultResolveInterval = 5 * time.Second
)

// Validate reports whether the configuration can be used.
func (c Config) Validate() error {
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("addr is empty"))
	}
	for _, a := range c.Agents {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("agent address %q: %w", a, err))
		}
	}
	if c.PollInterval <= 0 {
		errs = append(errs, errors.New("poll interval must be positive"))
	}
	if c.ResolveInterval <= 0 {
		errs = append(errs, errors.New("resolve interval must be positive"))
	}
	return errors.Join(errs...)
}

// ParseAgents splits the seed's REMOTE_HOSTS form, host:port;host:port
// (commas work too), dropping empty entries.
func ParseAgents(s string) []string {
	var out []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == ',' }) {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// Run is the controlplane program.
func Run(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == server.HealthCommand {
		return server.RunHealthCheck(ctx, "controlplane", args[1:], DefaultAddr, "CONTROLPLANE_ADDR", os.Getenv, stdout, stderr)
	}
	fs := cli.NewFlags("controlplane", stderr)
	addr := fs.String("addr", DefaultAddr, "address to serve gRPC, gRPC-Web, Connect, POST /run and GET /status on; without a cluster secret, loopback only (a bare port binds 127.0.0.1)")
	fs.Env("addr", "CONTROLPLANE_ADDR")
	agents := fs.String("agents", DefaultAgents, "agents as host:port;host:port; a host name is resolved again every --resolve-interval and each of its addresses is an agent; empty: only agents that join by themselves (agent --controlplanes)")
	fs.Env("agents", "REMOTE_HOSTS")
	poll := fs.Duration("poll-interval", DefaultPollInterval, "how often to read each configured agent's status")
	fs.Env("poll-interval", "POLL_INTERVAL")
	resolve := fs.Duration("resolve-interval", DefaultResolveInterval, "how often to resolve host names in --agents again")
	fs.Env("resolve-interval", "RESOLVE_INTERVAL")
	loadLinks := cluster.LinkFlags(fs)
	tlsFiles := tlsconfig.Flags(fs)
	logFormat, logLevel := cli.LogFlags(fs)
	metricsAddr := telemetry.MetricsFlags(fs)
	redisURL := fs.String("redis-url", "", "Redis keeping session bindings and agents' heartbeats for every control plane given the same URL, redis://[user:password@]host:port[/db] (rediss:// for TLS); empty: this control plane's memory, for one replica")
	fs.Env("redis-url", "REDIS_URL")
	redisPrefix := fs.String("redis-prefix", redisstore.DefaultPrefix, "prefix of every key this control plane keeps in Redis")
	fs.Env("redis-prefix", "REDIS_PREFIX")
	if err := fs.Parse(args, os.Getenv); err != nil {
		return err
	}
	logger, err := cli.NewLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		return err
	}
	links, err := loadLinks(os.Getenv)
	if err != nil {
		return err
	}
	secret := links.Secret
	cfg := Config{Addr: *addr, Agents: ParseAgents(*agents), PollInterval: *poll, ResolveInterval: *resolve, Secret: secret, Links: links, TLS: tlsFiles(),
		MetricsAddr: *metricsAddr, RedisURL: *redisURL, RedisPrefix: *redisPrefix}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if cfg.Addr, err = cluster.BindAddr(cfg.Addr, secret != nil, "control plane"); err != nil {
		return err
	}
	// The edges hold the cluster secret: their trace context is trusted.
	var stopTracing func()
	if cfg.Tracing, stopTracing, err = telemetry.StartTracing(ctx, telemetry.ServiceControlPlane, logger, telemetry.TrustRemote()); err != nil {
		return err
	}
	defer stopTracing()
	ln, err := server.Listen(ctx, cfg.Addr)
	if err != nil {
		return err
	}
	return Serve(ctx, cfg, ln, logger.With("component", "controlplane"))
}

// Serve serves the control plane on ln until ctx is done.
func Serve(ctx context.Context, cfg Config, ln net.Listener, logger *slog.Logger) error {
	tlsCfg, err := cfg.TLS.Server(logger.With("component", "tls"))
	if err != nil {
		ln.Close()
		return err
	}
	links := cfg.Links
	if links == nil {
		links = &cluster.Links{Secret: cfg.Secret}
	}
	var store router.Store // nil: memory
	if cfg.RedisURL != "" {
		rs, err := redisstore.New(cfg.RedisURL, cfg.RedisPrefix, cfg.Secret.Key(redisstore.KeyPurpose), logger.With("component", "redisstore"), links.ClientTLS)
		if err != nil {
			ln.Close()
			return err
		}
		defer rs.Close()
		// Not fatal: the control plane serves, and says unavailable for
		// what needs the store, until Redis answers.
		if err := rs.Ping(ctx); err != nil {
			logger.Warn("redis does not answer yet", "error", err)
		}
		store = rs
	}
	r, err := router.New(router.Config{
		Addresses:       cfg.Agents,
		PollInterval:    cfg.PollInterval,
		ResolveInterval: cfg.ResolveInterval,
		HTTPClient:      links.Client(nil),
		BaseURL:         links.URL,
		ClientOptions:   cfg.Tracing.ClientOptions(),
		Logger:          logger,
		Store:           store,
	})
	if err != nil {
		ln.Close()
		return err
	}
	r.Start(ctx)
	defer r.Close()
	svc := NewService(r, logger)
	svc.metrics = newMetrics(r)
	if err := svc.metrics.StartMetrics(ctx, cfg.MetricsAddr, logger.With("component", "metrics")); err != nil {
		ln.Close()
		return err
	}
	srv := server.New(logger)
	srv.TLS = tlsCfg
	srv.OnInvalid = svc.metrics.ObserveInvalid
	if cfg.Secret != nil {
		srv.Authenticate = cfg.Secret.Authenticate
	}
	srv.Browsers = cfg.Secret.Browsers()
	srv.HandleService(controlplanev1connect.NewControlPlaneServiceHandler(svc, srv.HandlerOptions(cfg.Tracing.HandlerOptions()...)...))
	srv.Handle("/run", cfg.Tracing.Handler("/run", runhttp.RunHandler(svc.runHTTP, runhttp.AnyContentType())))
	srv.Handle("/status", runhttp.StatusHandler(svc.statusHTTP))
	return srv.Serve(ctx, ln)
}
