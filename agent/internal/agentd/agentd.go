// Package agentd is the agent: it serves codemode.agent.v1.AgentService
// (gRPC, gRPC-Web and Connect on one port) and runs code in gVisor sandboxes
// through the Docker Engine, with a warm pool, sessions and streaming.
//
// Run is the agent binary; New and Agent.Serve let tests and benchmarks run
// an agent in process on a listener of their own.
package agentd

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/codemode-go/codemode/agent/internal/cpuslots"
	"github.com/codemode-go/codemode/agent/internal/egressgate"
	"github.com/codemode-go/codemode/agent/internal/languages"
	"github.com/codemode-go/codemode/agent/internal/pool"
	"github.com/codemode-go/codemode/agent/internal/sandbox"
	"github.com/codemode-go/codemode/agent/internal/wire"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	"github.com/codemode-go/codemode/internal/apicatalog"
	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/cluster"
	"github.com/codemode-go/codemode/internal/cpuset"
	"github.com/codemode-go/codemode/internal/hugepages"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/telemetry"
)

// Run runs the agent binary: it parses args and the environment, serves
// until ctx is done (SIGINT or SIGTERM), then removes every sandbox it made.
func Run(ctx context.Context, args []string, _ io.Reader, _, stderr io.Writer) error {
	cfg, err := ParseConfig(args, os.Getenv, stderr)
	if err != nil {
		return err
	}
	logger, err := cli.NewLogger(stderr, cfg.LogFormat, cfg.LogLevel)
	if err != nil {
		return err
	}
	if cfg.Addr, err = cluster.BindAddr(cfg.Addr, cfg.Secret != nil, "agent"); err != nil {
		return err
	}
	// The control planes hold the cluster secret: their trace context is
	// trusted.
	var stopTracing func()
	if cfg.Tracing, stopTracing, err = telemetry.StartTracing(ctx, telemetry.ServiceAgent, logger, telemetry.TrustRemote()); err != nil {
		return err
	}
	defer stopTracing()
	a, err := New(ctx, cfg, logger)
	if err != nil {
		return err
	}
	if err := a.svc.metrics.StartMetrics(ctx, cfg.MetricsAddr, logger.With("component", "metrics")); err != nil {
		a.Close(context.Background())
		return err
	}
	ln, err := server.Listen(ctx, cfg.Addr)
	if err != nil {
		a.Close(context.Background())
		return fmt.Errorf("listen on %s: %w", cfg.Addr, err)
	}
	return a.Serve(ctx, ln)
}

// Agent is a running agent: its sandboxes, sessions and service.
type Agent struct {
	cfg      Config
	log      *slog.Logger
	driver   *sandbox.Docker
	pool     *pool.Pool
	sessions *pool.Sessions
	journal  *pool.Journal // nil: none
	egress   *egressgate.Gate
	svc      *Service

	srvMu sync.Mutex
	srv   *server.Server // while serving: its health follows the engine
}

// setHealth makes the server's gRPC health say whether the agent can take
// runs (its container engine answers). It reads the pool's state itself, so
// that calls racing with a change still end in the right state.
func (a *Agent) setHealth(bool) {
	a.srvMu.Lock()
	defer a.srvMu.Unlock()
	if a.srv != nil {
		a.srv.SetServing(a.pool.Stats().Ready)
	}
}

// warnHugePages warns when the host's huge-page setting makes gVisor commit
// sandbox memory by writing it (see package hugepages).
func warnHugePages(logger *slog.Logger) {
	if hp := hugepages.Host(); hp.WriteCommitted() {
		logger.Warn("the host's huge-page setting lets a large allocation past a sandbox's memory limit take the whole sandbox, not only its run: set shmem_enabled to within_size (agent/host/setup.sh)",
			"transparent_huge_pages", hp.String())
	}
}

// New checks cfg, connects to the container engine, removes the sandboxes
// an earlier agent of the same name left behind, and starts filling the
// warm pool. The engine need not be reachable yet: until it is, the agent
// answers unavailable. Close (or Serve) removes everything.
func New(ctx context.Context, cfg Config, logger *slog.Logger) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkRunner(cfg.Runner); err != nil {
		return nil, err
	}
	catalog, err := apicatalog.FromFlag(cfg.APIs)
	if err != nil {
		return nil, err
	}
	driver, err := openDocker(ctx, cfg, logger)
	if err != nil {
		return nil, err
	}
	warnHugePages(logger)
	a := &Agent{cfg: cfg, log: logger, driver: driver}
	poolMetrics := pool.NewMetrics()
	hold := cfg.RunSlotHold
	if hold <= 0 {
		hold = cpuslots.DefaultHold
	}
	gate := cpuslots.New(cfg.RunSlots, hold)
	sets, err := cpuSets(ctx, cfg, driver, logger)
	if err != nil {
		driver.Close()
		return nil, err
	}
	p, err := pool.New(pool.Config{
		OnReady:  a.setHealth,
		Driver:   driver,
		Spec:     sandboxSpec(ctx, cfg, logger),
		MinWarm:  cfg.MinActive,
		Max:      cfg.MaxSandboxes,
		MaxReuse: cfg.MaxReuse,
		WarmIdle: cfg.WarmIdle,
		Labels:   map[string]string{sandbox.LabelAgent: cfg.Name},
		Logger:   logger.With("component", "pool"),
		Metrics:  poolMetrics,
		Gate:     gate,
		CPUSets:  sets,

		NamesPreloaded: namesPreloaded(cfg),
	})
	if err != nil {
		driver.Close()
		return nil, err
	}
	p.Start(ctx)
	journal, err := openJournal(cfg.StateDir, logger)
	if err != nil {
		p.Close(context.WithoutCancel(ctx))
		driver.Close()
		return nil, err
	}
	sessions := pool.NewSessions(p, pool.SessionsConfig{
		Max:          cfg.MaxSessions,
		MaxPerTenant: cfg.MaxSessionsPerTenant,
		IdleTTL:      cfg.SessionIdleTTL,
		MaxIdleTTL:   cfg.MaxSessionIdleTTL,
		Journal:      journal,
		Logger:       logger.With("component", "sessions"),
	})
	a.pool, a.sessions, a.journal = p, sessions, journal
	a.egress = egressgate.New(egressgate.Config{
		APIs:     catalog,
		Defaults: egressgate.Limits{Connections: cfg.EgressMaxConnections, Bytes: cfg.EgressMaxBytes, ConnectionTime: cfg.EgressMaxConnectionTime},
		Max:      egressgate.Limits{Connections: cfg.EgressMaxConnections, Bytes: cfg.EgressMaxBytes, ConnectionTime: cfg.EgressMaxConnectionTime},
		Deny:     append(ownAddrs(cfg.Addr), cfg.EgressDeny...),
		Hosts:    cfg.EgressHosts,
		Log:      logger.With("component", "egress"),
	})
	a.svc = &Service{cfg: &a.cfg, log: logger.With("component", "service"), pool: p, gate: gate, sessions: sessions, egress: a.egress, metrics: telemetry.NewMetrics()}
	a.svc.metrics.MustRegister(newPoolCollector(a.svc), poolMetrics)
	logger.Info("agent started", "name", cfg.Name, "labels", labelString(cfg.Labels), "image", cfg.Image,
		"runtime", cfg.Runtime, "min_active", cfg.MinActive, "max_sandboxes", cfg.MaxSandboxes, "run_slots", cfg.RunSlots, "cpu_sets", len(sets))
	return a, nil
}

// openDocker connects to the Docker Engine and checks that it has the
// sandbox image. An engine that does not answer yet is not an error: the
// pool waits for it.
func openDocker(ctx context.Context, cfg Config, logger *slog.Logger) (*sandbox.Docker, error) {
	driver, err := sandbox.NewDocker(cfg.DockerHost, logger.With("component", "docker"))
	if err != nil {
		return nil, err
	}
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	ok, err := driver.HasImage(ictx, cfg.Image)
	cancel()
	switch {
	case err != nil:
		// The engine may come later; the pool waits for it.
		logger.Warn("cannot check the sandbox image yet", "image", cfg.Image, "error", err)
	case !ok:
		driver.Close()
		return nil, fmt.Errorf("sandbox image %s is not present locally: build it with `make setup` (agent/host/setup.sh), or pull it where a registry is reachable", cfg.Image)
	}
	return driver, nil
}

// namesPreloaded says whether a stateless run would use its sandbox's
// preloaded parent: its language has one and its code names a preloaded
// module. Nil when the sandboxes preload nothing.
func namesPreloaded(cfg Config) func(language, code string) bool {
	mods := languages.PreloadList(cfg.Preload)
	if !cfg.Prestart || len(mods) == 0 {
		return nil
	}
	return func(language, code string) bool {
		l, ok := languages.Lookup(language)
		return ok && l.Parent != nil && languages.NamesModule(code, mods)
	}
}

// sandboxSpec is the container every sandbox is: the image with the
// runner bound in and started as its command, the resource limits, and
// the tmpfs mounts.
func sandboxSpec(ctx context.Context, cfg Config, logger *slog.Logger) sandbox.Spec {
	command := []string{wire.RunnerPath}
	if logger.Enabled(ctx, slog.LevelDebug) {
		// The runner's log lines reach this log at debug level (see
		// pool.open); at debug it says what each run spent its time on.
		command = append(command, "-log-level=debug")
	}
	if !cfg.Prestart {
		command = append(command, "-prestart=false")
	}
	if mods := languages.PreloadList(cfg.Preload); cfg.Prestart && len(mods) > 0 {
		command = append(command, "-preload="+strings.Join(mods, ","))
	}
	return sandbox.Spec{
		Image:       cfg.Image,
		Runtime:     cfg.Runtime,
		Command:     command,
		Binds:       map[string]string{cfg.Runner: wire.RunnerPath},
		CapAdd:      wire.RunnerCapabilities,
		User:        "0:0",
		MemoryBytes: cfg.Memory,
		NanoCPUs:    int64(cfg.CPUs * 1e9),
		PidsLimit:   cfg.PidsLimit,
		Tmpfs: map[string]string{
			wire.Workspace: fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,mode=0755,uid=%d,gid=%d", cfg.WorkspaceSize, wire.UserUID, wire.UserGID),
			"/tmp":         fmt.Sprintf("rw,exec,nosuid,nodev,size=%d,mode=1777", cfg.TmpSize),
			// The runner's Python modules (see wire.UserLib); it makes
			// the directory root's before user code runs.
			wire.UserLib: "rw,noexec,nosuid,nodev,size=1m,mode=0755",
		},
		ShmBytes: cfg.ShmSize,
	}
}

// cpuSets returns the host's CPUs split into sets of cfg.CPUs for the
// sandboxes to be pinned to, or nil: not pinned (cfg.PinCPUs is off, the
// host has too few CPUs, or the engine's cgroups cannot be prepared).
func cpuSets(ctx context.Context, cfg Config, driver *sandbox.Docker, logger *slog.Logger) ([]string, error) {
	if !cfg.PinCPUs {
		return nil, nil
	}
	cpus, err := cpuset.Host()
	if err != nil {
		return nil, err
	}
	sets := cpuset.Split(cpus, cfg.CPUs)
	if sets != nil {
		// Pinning is worth having, not worth failing every sandbox
		// start for.
		if err := driver.PrepareCPUSets(ctx); err != nil {
			logger.Warn("sandboxes not pinned to CPUs: cannot prepare the engine's cgroups", "error", err)
			return nil, nil
		}
	}
	return sets, nil
}

// openJournal opens the sessions' journal in dir; nil with an empty dir:
// no journal.
func openJournal(dir string, logger *slog.Logger) (*pool.Journal, error) {
	if dir == "" {
		return nil, nil
	}
	journal, err := pool.OpenJournal(dir)
	if err != nil {
		return nil, err
	}
	if n := journal.Lost(); n > 0 {
		logger.Warn("sessions lost when the agent last stopped", "sessions", n)
	}
	return journal, nil
}

// ownAddrs are the addresses of the agent's listener that no egress rule
// may open: its port on every local address when it listens on all of them.
func ownAddrs(addr string) []netip.AddrPort {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.IsLoopback() {
		// A name, all addresses, or loopback, which the sandbox's
		// proxy may also reach as another loopback address.
		a = netip.IPv6Unspecified()
	}
	return []netip.AddrPort{netip.AddrPortFrom(a.Unmap(), uint16(p))}
}

// checkRunner checks that path is a static executable: the runner runs in
// the sandbox image, which has no Go toolchain's C libraries to offer.
func checkRunner(path string) error {
	hint := "build it with `CGO_ENABLED=0 go build ./agent/cmd/runner` next to the agent binary, or pass --runner"
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("runner binary %s: %w (%s)", path, err, hint)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("runner binary %s is dynamically linked: %s", path, hint)
		}
	}
	return nil
}

// Pool returns the agent's sandbox pool.
func (a *Agent) Pool() *pool.Pool { return a.pool }

// Driver returns the agent's Docker driver.
func (a *Agent) Driver() *sandbox.Docker { return a.driver }

// register mounts the AgentService (with health and reflection) on srv.
func (a *Agent) register(srv *server.Server) {
	h := &handler{svc: a.svc, log: a.log.With("component", "handler")}
	srv.HandleService(agentv1connect.NewAgentServiceHandler(h, srv.HandlerOptions(a.cfg.Tracing.HandlerOptions()...)...))
}

// Serve serves the agent's API on ln until ctx is done, then shuts down
// gracefully and removes every sandbox (Close).
func (a *Agent) Serve(ctx context.Context, ln net.Listener) error {
	// The port the agent really serves on, which its configured address
	// may leave to the system (":0").
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil {
		a.egress.Deny(ownAddrs(netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()).String())...)
	}
	srv := server.New(a.log.With("component", "server"))
	srv.ShutdownTimeout = a.cfg.ShutdownTimeout
	srv.OnInvalid = a.svc.metrics.ObserveInvalid
	var err error
	if srv.TLS, err = a.cfg.TLS.Server(a.log.With("component", "tls")); err != nil {
		ln.Close()
		return err
	}
	if a.cfg.Secret != nil {
		srv.Authenticate = a.cfg.Secret.Authenticate
	}
	srv.Browsers = a.cfg.Secret.Browsers()
	a.register(srv)
	// Serve marks the server serving before it accepts; from the first
	// accept on, health follows the engine.
	ln = &firstAccept{Listener: ln, f: func() {
		a.srvMu.Lock()
		a.srv = srv
		a.srvMu.Unlock()
		a.setHealth(true)
	}}
	// The heartbeats end, saying the agent leaves, as soon as ctx is done,
	// while the server still drains its runs.
	hctx, stopBeating := context.WithCancel(ctx)
	beating := make(chan struct{})
	go func() {
		defer close(beating)
		a.heartbeat(hctx, advertiseAddr(a.cfg.AdvertiseAddr, ln.Addr().String()))
	}()
	err = srv.Serve(ctx, ln)
	stopBeating()
	<-beating
	a.srvMu.Lock()
	a.srv = nil
	a.srvMu.Unlock()
	cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return errors.Join(err, a.Close(cctx))
}

// firstAccept calls f when Accept is first called.
type firstAccept struct {
	net.Listener
	once sync.Once
	f    func()
}

func (l *firstAccept) Accept() (net.Conn, error) {
	l.once.Do(l.f)
	return l.Listener.Accept()
}

// Close closes every session and removes every sandbox of the agent.
func (a *Agent) Close(ctx context.Context) error {
	a.sessions.CloseAll()
	if a.journal != nil {
		if err := a.journal.Close(); err != nil {
			a.log.Warn("close the session journal", "error", err)
		}
	}
	err := a.pool.Close(ctx)
	a.driver.Close()
	a.egress.Close()
	if err != nil {
		a.log.Warn("remove sandboxes at shutdown", "error", err)
		return err
	}
	a.log.Info("agent stopped; sandboxes removed")
	return nil
}
