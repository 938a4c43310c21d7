package agentd

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/codemode-go/codemode/agent/internal/pool"
	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/cluster"
	"github.com/codemode-go/codemode/internal/limits"
	"github.com/codemode-go/codemode/internal/telemetry"
	"github.com/codemode-go/codemode/internal/tlsconfig"
)

// Config configures an agent. ParseConfig fills it from flags and
// environment variables; Validate checks it.
type Config struct {
	// Addr is the address to serve on (gRPC, gRPC-Web and Connect).
	Addr string
	// Name identifies the agent in results, status and container labels.
	// Two agents on one host must have different names: each removes the
	// leftover sandboxes of its own name when it starts.
	Name string
	// Labels are reported in status, for routing.
	Labels map[string]string

	// Image is the sandbox image; it must be present locally.
	Image string
	// Runtime is the OCI runtime of the sandboxes.
	Runtime string
	// Runner is the host path of the runner binary, bind-mounted read-only
	// into every sandbox.
	Runner string
	// DockerHost is the engine's address; empty: DOCKER_HOST or the
	// default socket.
	DockerHost string

	// MinActive sandboxes are kept warm.
	MinActive int
	// MaxSandboxes bounds the sandboxes held at once (warm, busy and held
	// by sessions).
	MaxSandboxes int
	// MaxReuse bounds the stateless runs one sandbox serves (scrubbed
	// between runs) before it is destroyed.
	MaxReuse int
	// Prestart has each sandbox's runner start the interpreter of the next
	// stateless run ahead of it, when the sandbox is scrubbed.
	Prestart bool
	// Preload is what each sandbox's preloaded parent imports before it
	// forks the prestarted interpreters of stateless Python runs:
	// comma-separated modules, or "default" (the languages table's list,
	// the default); "none" or "": no parent, each interpreter starts
	// fresh.
	Preload string
	// RunSlots bounds the sandboxes that work at once, running (for up to
	// cpuslots.DefaultHold of each run) or being scrubbed; runs beyond it wait
	// in arrival order (see package cpuslots). 0: no bound.
	RunSlots int
	// RunSlotHold is how long a run keeps its slot at most; 0:
	// cpuslots.DefaultHold. It has no flag.
	RunSlotHold time.Duration
	// QueueTimeout bounds how long a request waits for a free sandbox
	// (and for a run slot).
	QueueTimeout time.Duration
	// WarmIdle is how long a warm sandbox beyond MinActive may stay unused
	// before it is destroyed.
	WarmIdle time.Duration

	// DefaultTimeout and MaxTimeout bound a run's wall-clock time.
	DefaultTimeout, MaxTimeout time.Duration
	// Memory is the default memory limit of a sandbox; MaxMemory the most a
	// request may ask for.
	Memory, MaxMemory int64
	// CPUs is the CPU limit of a sandbox.
	CPUs float64
	// PinCPUs pins each sandbox to as many of the host's CPUs as CPUs
	// rounds up to, spreading the sandboxes over them (see CPUSets).
	PinCPUs bool
	// PidsLimit bounds the host threads of a sandbox (under runsc they
	// include the sandbox kernel's own).
	PidsLimit int64
	// WorkspaceSize, TmpSize and ShmSize size the sandbox's writable tmpfs
	// mounts /workspace, /tmp and /dev/shm.
	WorkspaceSize, TmpSize, ShmSize int64
	// DefaultOutput and MaxOutput bound the bytes of stdout plus stderr
	// kept of a run.
	DefaultOutput, MaxOutput int64

	// SessionIdleTTL closes a session after this long without a run;
	// MaxSessionIdleTTL bounds what a session may ask for.
	SessionIdleTTL, MaxSessionIdleTTL time.Duration
	// MaxSessions bounds the open sessions.
	MaxSessions int
	// MaxSessionsPerTenant bounds the open sessions of one tenant, so that
	// one tenant cannot hold every session while the others are refused.
	// At or above MaxSessions it bounds nothing more.
	MaxSessionsPerTenant int

	// EgressMaxConnections, EgressMaxBytes and EgressMaxConnectionTime bound
	// a run's egress (connections opened, bytes both ways, how long one
	// connection stays open; 0: no bound but the run's). A run's own
	// limits may only lower them.
	EgressMaxConnections    int
	EgressMaxBytes          int64
	EgressMaxConnectionTime time.Duration
	// EgressDeny are addresses no egress rule opens, besides the agent's
	// own: the control plane's and the edge's, say. An unspecified address
	// (":8080", "0.0.0.0:8080") means that port on every address of this
	// host, loopback included.
	EgressDeny []netip.AddrPort
	// APIs is the API declaration file (see internal/apicatalog), the same as
	// the edge's: code reaches each API at http://<name>.api.codemode/ when
	// its run's egress allows that name, and the agent forwards the
	// requests with the API's credential. Empty: the shipped declaration;
	// "none": no APIs.
	APIs string
	// EgressHosts are names the agent resolves for egress without asking
	// DNS, as a hosts file would (internal services, pinned addresses).
	// Their addresses are checked like any others.
	EgressHosts map[string][]netip.Addr

	// ControlPlanes are the control planes the agent joins by itself
	// (host:port or http://host:port): it sends each its address and status
	// every HeartbeatInterval, and leaves their routing when it stops.
	// Empty: the agent waits to be listed in a control plane's agents.
	ControlPlanes []string
	// AdvertiseAddr is the address the control planes reach the agent at,
	// host:port. Empty: the address it listens on, or, when that is every
	// address, its host name with the port it listens on.
	AdvertiseAddr string
	// HeartbeatInterval is how often the agent sends its heartbeat; a
	// control plane takes it out of routing after three intervals without
	// one.
	HeartbeatInterval time.Duration
	// ShutdownTimeout bounds the graceful shutdown of the server.
	ShutdownTimeout time.Duration

	// Secret is the cluster secret every caller must send; nil: none, and
	// the agent serves on loopback only.
	Secret *cluster.Secret
	// Links are how the agent calls the control planes (heartbeats): with
	// Secret, over TLS with a cluster CA. Nil: plain h2c.
	Links *cluster.Links
	// TLS are the certificate and key the agent serves HTTPS with; empty:
	// plain HTTP.
	TLS tlsconfig.Files

	// StateDir keeps what the agent must remember across restarts: the
	// journal of its sessions, so that sessions lost in a restart answer
	// "lost" rather than open again empty. Empty: remember nothing.
	StateDir string

	// LogFormat ("text" or "json") and LogLevel configure the logger Run
	// builds.
	LogFormat, LogLevel string

	// MetricsAddr is the loopback address Run serves Prometheus metrics
	// on, at /metrics; empty: none.
	MetricsAddr string

	// Tracing exports the agent's spans; Run sets it from OpenTelemetry's
	// variables (see telemetry.NewTracing). Nil: none.
	Tracing *telemetry.Tracing
}

// DefaultConfig returns the defaults of every setting.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	runner := "runner"
	if exe, err := os.Executable(); err == nil {
		runner = filepath.Join(filepath.Dir(exe), "runner")
	}
	return Config{
		Addr:              ":30031",
		Name:              host,
		Image:             limits.SandboxImage,
		Runtime:           "runsc",
		Runner:            runner,
		MinActive:         2,
		MaxSandboxes:      16,
		MaxReuse:          100,
		Prestart:          true,
		Preload:           "default",
		RunSlots:          runtime.NumCPU(),
		QueueTimeout:      limits.QueueTimeout,
		WarmIdle:          pool.DefaultWarmIdle,
		DefaultTimeout:    limits.DefaultTimeout,
		MaxTimeout:        limits.MaxTimeout,
		Memory:            limits.DefaultMemoryBytes,
		MaxMemory:         limits.MaxMemoryBytes,
		CPUs:              1,
		PinCPUs:           true,
		PidsLimit:         256,
		WorkspaceSize:     64 << 20,
		TmpSize:           16 << 20,
		ShmSize:           16 << 20,
		DefaultOutput:     limits.DefaultOutputBytes,
		MaxOutput:         limits.MaxOutputBytes,
		SessionIdleTTL:    limits.DefaultSessionIdle,
		MaxSessionIdleTTL: limits.MaxSessionIdle,
		MaxSessions:       8,
		// Half of MaxSessions: a tenant alone cannot take them all.
		MaxSessionsPerTenant: 4,
		ShutdownTimeout:      10 * time.Second,
		HeartbeatInterval:    500 * time.Millisecond,
		LogFormat:            "text",

		EgressMaxConnections: 64,
		EgressMaxBytes:       128 << 20,
		LogLevel:             "info",
	}
}

// ParseConfig parses args and the environment (read with getenv) into a
// Config over the defaults, and validates it. Usage goes to w.
func ParseConfig(args []string, getenv func(string) string, w io.Writer) (Config, error) {
	cfg := DefaultConfig()
	f := cli.NewFlags("agent", w)
	cfg.identityFlags(f)
	cfg.sandboxFlags(f)
	cfg.poolFlags(f)
	cfg.runLimitFlags(f)
	cfg.sessionFlags(f)
	cfg.egressFlags(f)
	cfg.clusterFlags(f)
	loadLinks := cluster.LinkFlags(f)
	tlsFiles := tlsconfig.Flags(f)
	format, level := cli.LogFlags(f)
	metricsAddr := telemetry.MetricsFlags(f)
	if err := f.Parse(args, getenv); err != nil {
		return Config{}, err
	}
	cfg.MetricsAddr = *metricsAddr
	links, err := loadLinks(getenv)
	if err != nil {
		return Config{}, err
	}
	cfg.Secret, cfg.Links, cfg.TLS = links.Secret, links, tlsFiles()
	switch cfg.StateDir {
	case "":
		base := getenv("CODEMODE_STATE_DIR")
		if base == "" {
			base = "/var/lib/codemode"
		}
		cfg.StateDir = filepath.Join(base, "agents", cfg.Name)
	case "none":
		cfg.StateDir = ""
	}
	cfg.LogFormat, cfg.LogLevel = *format, *level
	if cfg.DockerHost == "" {
		cfg.DockerHost = getenv("DOCKER_HOST")
	}
	return cfg, cfg.Validate()
}

// identityFlags defines the flags of where the agent serves and what it is called.
func (cfg *Config) identityFlags(f *cli.Flags) {
	f.Func("addr", "address to serve gRPC, gRPC-Web and Connect on; a bare port means all interfaces with a cluster secret, 127.0.0.1 without one (default \":30031\")", func(s string) error {
		cfg.Addr = normalizeAddr(s)
		return nil
	})
	f.Env("addr", "WORKER_PORT")
	f.StringVar(&cfg.Name, "name", cfg.Name, "name of the agent, in results, status and sandbox labels (default: host name)")
	f.Env("name", "AGENT_NAME")
	f.Func("labels", "labels for routing, k=v,k=v", func(s string) error {
		l, err := parseLabels(s)
		cfg.Labels = l
		return err
	})
	f.Env("labels", "AGENT_LABELS")
}

// sandboxFlags defines the flags of what the sandboxes run on.
func (cfg *Config) sandboxFlags(f *cli.Flags) {
	f.StringVar(&cfg.Image, "image", cfg.Image, "sandbox image (must be present locally)")
	f.Env("image", "DOCKER_IMAGE_NAME")
	f.StringVar(&cfg.Runtime, "runtime", cfg.Runtime, "OCI runtime of the sandboxes")
	f.Env("runtime", "SANDBOX_RUNTIME")
	f.StringVar(&cfg.Runner, "runner", cfg.Runner, "host path of the static runner binary mounted into every sandbox (default: runner next to this binary)")
	f.Env("runner", "RUNNER_PATH")
	f.StringVar(&cfg.DockerHost, "docker-host", "", "Docker Engine address (default: DOCKER_HOST or the local socket)")
}

// poolFlags defines the flags of the pool of sandboxes and the queue for them.
func (cfg *Config) poolFlags(f *cli.Flags) {
	f.IntVar(&cfg.MinActive, "min-active", cfg.MinActive, "warm sandboxes kept ready beside those at work; while runs wait for the CPUs (--run-slots), this many in all")
	f.Env("min-active", "MIN_ACTIVE")
	f.IntVar(&cfg.MaxSandboxes, "max-sandboxes", cfg.MaxSandboxes, "most sandboxes held at once (warm, busy and sessions)")
	f.Env("max-sandboxes", "MAX_SANDBOXES")
	f.IntVar(&cfg.MaxReuse, "max-reuse", cfg.MaxReuse, "stateless runs one sandbox serves at most, scrubbed between runs, before it is destroyed (each retires after its own number, between nine tenths of this and all of it)")
	f.Env("max-reuse", "MAX_REUSE")
	f.BoolVar(&cfg.Prestart, "prestart", cfg.Prestart, "start the interpreter of a sandbox's next stateless run when it is scrubbed, so that the run does not wait for it")
	f.Env("prestart", "PRESTART")
	f.StringVar(&cfg.Preload, "preload", cfg.Preload, `modules each sandbox imports once, in a parent that forks the interpreter of every stateless Python run that names one, comma-separated, or "default" (numpy, pandas, matplotlib, requests, scipy); "none" or empty: none, each run's interpreter starts fresh`)
	f.Env("preload", "PRELOAD")
	f.IntVar(&cfg.RunSlots, "run-slots", cfg.RunSlots, "sandboxes working at once (running the start of a program, or being scrubbed); further runs wait their turn; 0: no bound (default: the host's CPUs)")
	f.Env("run-slots", "RUN_SLOTS")
	f.DurationVar(&cfg.QueueTimeout, "queue-timeout", cfg.QueueTimeout, "how long a request waits for a free sandbox and a run slot")
	f.Env("queue-timeout", "QUEUE_TIMEOUT")
	f.DurationVar(&cfg.WarmIdle, "warm-idle", cfg.WarmIdle, "warm sandboxes beyond --min-active unused this long are destroyed")
	f.Env("warm-idle", "WARM_IDLE")
}

// runLimitFlags defines the flags of a run's limits: what a request gets when it sets none, and the most it may ask for.
func (cfg *Config) runLimitFlags(f *cli.Flags) {
	f.DurationVar(&cfg.DefaultTimeout, "default-timeout", cfg.DefaultTimeout, "run timeout when the request sets none")
	f.Env("default-timeout", "DEFAULT_TIMEOUT")
	f.DurationVar(&cfg.MaxTimeout, "max-timeout", cfg.MaxTimeout, "longest run timeout a request may ask for")
	f.Env("max-timeout", "MAX_TIMEOUT")
	bytesFlag(f, &cfg.Memory, "memory", "SANDBOX_MEMORY", "default memory limit of a sandbox (e.g. 512m)")
	bytesFlag(f, &cfg.MaxMemory, "max-memory", "MAX_MEMORY", "largest memory limit a request may ask for")
	f.Float64Var(&cfg.CPUs, "cpus", cfg.CPUs, "CPU limit of a sandbox")
	f.Env("cpus", "SANDBOX_CPUS")
	f.BoolVar(&cfg.PinCPUs, "pin-cpus", cfg.PinCPUs, "pin each sandbox to as many of the host's CPUs as --cpus rounds up to, spreading sandboxes over them (nothing is pinned when the host has fewer than twice that many)")
	f.Env("pin-cpus", "SANDBOX_PIN_CPUS")
	f.Int64Var(&cfg.PidsLimit, "pids-limit", cfg.PidsLimit, "pids limit of a sandbox (under runsc it counts the sandbox kernel's threads too)")
	f.Env("pids-limit", "SANDBOX_PIDS_LIMIT")
	bytesFlag(f, &cfg.WorkspaceSize, "workspace-size", "WORKSPACE_SIZE", "size of the /workspace tmpfs")
	bytesFlag(f, &cfg.TmpSize, "tmp-size", "TMP_SIZE", "size of the /tmp tmpfs")
	bytesFlag(f, &cfg.ShmSize, "shm-size", "SHM_SIZE", "size of /dev/shm")
	bytesFlag(f, &cfg.DefaultOutput, "default-output", "DEFAULT_OUTPUT", "bytes of stdout plus stderr kept when the request sets no limit")
	bytesFlag(f, &cfg.MaxOutput, "max-output", "MAX_OUTPUT", "most bytes of stdout plus stderr a request may ask to keep")
}

// sessionFlags defines the flags of sessions.
func (cfg *Config) sessionFlags(f *cli.Flags) {
	f.DurationVar(&cfg.SessionIdleTTL, "session-idle-ttl", cfg.SessionIdleTTL, "a session is closed after this long without a run")
	f.Env("session-idle-ttl", "SESSION_IDLE_TTL")
	f.DurationVar(&cfg.MaxSessionIdleTTL, "max-session-idle-ttl", cfg.MaxSessionIdleTTL, "longest idle timeout a session may ask for")
	f.Env("max-session-idle-ttl", "MAX_SESSION_IDLE_TTL")
	f.IntVar(&cfg.MaxSessions, "max-sessions", cfg.MaxSessions, "most open sessions")
	f.Env("max-sessions", "MAX_SESSIONS")
	f.IntVar(&cfg.MaxSessionsPerTenant, "max-sessions-per-tenant", cfg.MaxSessionsPerTenant, "most open sessions of one tenant, so that one tenant cannot hold them all (at or above --max-sessions: no bound of its own)")
	f.Env("max-sessions-per-tenant", "MAX_SESSIONS_PER_TENANT")
}

// egressFlags defines the flags of what runs may reach outside their sandboxes.
func (cfg *Config) egressFlags(f *cli.Flags) {
	f.IntVar(&cfg.EgressMaxConnections, "egress-max-connections", cfg.EgressMaxConnections, "most egress connections one run may open (0: no limit)")
	f.Env("egress-max-connections", "EGRESS_MAX_CONNECTIONS")
	bytesFlag(f, &cfg.EgressMaxBytes, "egress-max-bytes", "EGRESS_MAX_BYTES", "most bytes one run may send and receive through its egress (0: no limit)")
	f.DurationVar(&cfg.EgressMaxConnectionTime, "egress-max-connection-time", cfg.EgressMaxConnectionTime, "longest an egress connection may stay open (0: until the run ends)")
	f.Env("egress-max-connection-time", "EGRESS_MAX_CONNECTION_TIME")
	f.Func("egress-deny", "comma-separated addresses (IP:PORT, or :PORT for every address of this host) no egress rule opens, such as the control plane's and the edge's; the agent's own is always denied", func(v string) error {
		d, err := parseEgressDeny(v)
		cfg.EgressDeny = d
		return err
	})
	f.Env("egress-deny", "EGRESS_DENY")
	f.StringVar(&cfg.APIs, "apis", "", "API declaration file (JSON; see docs/code-mode.md): code reaches each API at http://NAME.api.codemode/ when its egress allows it, with the API's credential added by the agent; empty: the shipped declaration (GitHub's public API); \"none\": no APIs")
	f.Env("apis", "CODEMODE_APIS")
	f.Func("egress-hosts", "comma-separated NAME=IP entries the agent resolves for egress without DNS, like a hosts file; the addresses still need rules when they are not public", func(v string) error {
		h, err := parseEgressHosts(v)
		cfg.EgressHosts = h
		return err
	})
	f.Env("egress-hosts", "EGRESS_HOSTS")
}

// clusterFlags defines the flags of the agent's life in a cluster: shutdown, state, control planes.
func (cfg *Config) clusterFlags(f *cli.Flags) {
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "how long shutdown waits for requests in flight")
	f.Env("shutdown-timeout", "SHUTDOWN_TIMEOUT")
	f.StringVar(&cfg.StateDir, "state-dir", "", "directory for the agent's state across restarts (its session journal); \"none\" keeps nothing (default: $CODEMODE_STATE_DIR/agents/NAME, CODEMODE_STATE_DIR defaulting to /var/lib/codemode)")
	f.Env("state-dir", "AGENT_STATE_DIR")
	f.Func("controlplanes", "control planes to join by heartbeat, URL or host:port, comma-separated; empty: wait to be listed in a control plane's --agents", func(v string) error {
		cfg.ControlPlanes = nil
		for _, u := range strings.Split(v, ",") {
			if u = strings.TrimSpace(u); u != "" {
				cfg.ControlPlanes = append(cfg.ControlPlanes, u)
			}
		}
		return nil
	})
	f.Env("controlplanes", "CONTROLPLANES")
	f.StringVar(&cfg.AdvertiseAddr, "advertise-addr", "", "host:port the control planes reach this agent at (default: the listen address, or the host name and port when it listens on every address)")
	f.Env("advertise-addr", "ADVERTISE_ADDR")
	f.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", cfg.HeartbeatInterval, "how often to send the control planes a heartbeat; they stop routing to the agent after three missed")
	f.Env("heartbeat-interval", "HEARTBEAT_INTERVAL")
}

// parseEgressDeny parses --egress-deny: comma-separated IP:PORT or :PORT.
func parseEgressDeny(v string) ([]netip.AddrPort, error) {
	var deny []netip.AddrPort
	for _, a := range strings.Split(v, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if strings.HasPrefix(a, ":") {
			a = "[::]" + a
		}
		ap, err := netip.ParseAddrPort(a)
		if err != nil {
			return nil, fmt.Errorf("egress-deny %q: want IP:PORT or :PORT", a)
		}
		deny = append(deny, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
	}
	return deny, nil
}

// parseEgressHosts parses --egress-hosts: comma-separated NAME=IP.
func parseEgressHosts(v string) (map[string][]netip.Addr, error) {
	hosts := make(map[string][]netip.Addr)
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		name, ip, ok := strings.Cut(e, "=")
		a, err := netip.ParseAddr(strings.TrimSpace(ip))
		if !ok || err != nil || strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("egress-hosts %q: want NAME=IP", e)
		}
		name = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(name)), ".")
		hosts[name] = append(hosts[name], a.Unmap())
	}
	return hosts, nil
}

// Validate reports the first problem with c.
func (c *Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Addr != "", "addr is empty")
	check(c.Name != "", "name is empty")
	check(c.Image != "", "image is empty")
	check(c.Runtime != "", "runtime is empty")
	check(c.Runner != "", "runner is empty")
	check(c.MaxSandboxes >= 1, "max-sandboxes %d: want at least 1", c.MaxSandboxes)
	check(c.MinActive >= 0 && c.MinActive <= c.MaxSandboxes, "min-active %d: want 0 to max-sandboxes (%d)", c.MinActive, c.MaxSandboxes)
	check(c.MaxReuse >= 1, "max-reuse %d: want at least 1", c.MaxReuse)
	check(c.RunSlots >= 0, "run-slots %d: want 0 (no bound) or more", c.RunSlots)
	check(c.QueueTimeout > 0, "queue-timeout must be positive")
	check(c.WarmIdle > 0, "warm-idle must be positive")
	check(c.DefaultTimeout > 0 && c.DefaultTimeout <= c.MaxTimeout, "default-timeout %v: want positive and at most max-timeout (%v)", c.DefaultTimeout, c.MaxTimeout)
	check(c.MaxTimeout <= limits.TimeoutCeiling, "max-timeout %v: want at most %v", c.MaxTimeout, limits.TimeoutCeiling)
	check(c.Memory >= limits.MinMemoryBytes && c.Memory <= c.MaxMemory, "memory %d: want %d to max-memory (%d)", c.Memory, limits.MinMemoryBytes, c.MaxMemory)
	check(c.MaxMemory <= limits.MemoryCeiling, "max-memory %d: want at most %d", c.MaxMemory, limits.MemoryCeiling)
	check(c.CPUs > 0, "cpus must be positive")
	check(c.PidsLimit >= 128, "pids-limit %d: runsc needs at least 128", c.PidsLimit)
	check(c.WorkspaceSize > 0 && c.TmpSize > 0 && c.ShmSize > 0, "tmpfs sizes must be positive")
	check(c.DefaultOutput > 0 && c.DefaultOutput <= c.MaxOutput, "default-output %d: want positive and at most max-output (%d)", c.DefaultOutput, c.MaxOutput)
	check(c.MaxOutput <= limits.OutputCeiling, "max-output %d: want at most %d", c.MaxOutput, limits.OutputCeiling)
	check(c.SessionIdleTTL > 0 && c.SessionIdleTTL <= c.MaxSessionIdleTTL, "session-idle-ttl %v: want positive and at most max-session-idle-ttl", c.SessionIdleTTL)
	check(c.MaxSessionIdleTTL <= limits.MaxSessionIdle, "max-session-idle-ttl %v: want at most %v", c.MaxSessionIdleTTL, limits.MaxSessionIdle)
	check(c.MaxSessions >= 0 && c.MaxSessions <= c.MaxSandboxes, "max-sessions %d: want 0 to max-sandboxes (%d)", c.MaxSessions, c.MaxSandboxes)
	check(c.MaxSessionsPerTenant >= 1, "max-sessions-per-tenant %d: want at least 1", c.MaxSessionsPerTenant)
	check(!strings.ContainsAny(c.Name, "=,\n"), "name %q: no '=', ',' or newline", c.Name)
	check(c.HeartbeatInterval >= 100*time.Millisecond && c.HeartbeatInterval <= time.Minute, "heartbeat-interval %v: want 100ms to 1m", c.HeartbeatInterval)
	if c.AdvertiseAddr != "" {
		host, port, err := net.SplitHostPort(c.AdvertiseAddr)
		ip, ipErr := netip.ParseAddr(host)
		check(err == nil && host != "" && port != "" && (ipErr != nil || !ip.IsUnspecified()), "advertise-addr %q: want a reachable host:port", c.AdvertiseAddr)
	}
	for _, u := range c.ControlPlanes {
		_, err := url.Parse(c.Links.URL(u))
		check(err == nil, "controlplanes %q: %v", u, err)
	}
	return errors.Join(errs...)
}

// normalizeAddr accepts WORKER_PORT's forms: "30031", ":30031" or
// "host:port".
func normalizeAddr(s string) string {
	if _, err := strconv.Atoi(s); err == nil {
		return ":" + s
	}
	return s
}

func parseLabels(s string) (map[string]string, error) {
	l := map[string]string{}
	for kv := range strings.SplitSeq(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("label %q: want key=value", kv)
		}
		l[k] = v
	}
	return l, nil
}

// bytesFlag defines a byte-size flag: a number with an optional suffix k,
// m, g (powers of 1024, also written KiB, MiB, GiB).
func bytesFlag(f *cli.Flags, p *int64, name, env, usage string) {
	def := *p
	f.Func(name, fmt.Sprintf("%s (default %s)", usage, formatBytes(def)), func(s string) error {
		n, err := parseBytes(s)
		if err != nil {
			return err
		}
		*p = n
		return nil
	})
	f.Env(name, env)
}

func parseBytes(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "ib"), "b")
	mult := int64(1)
	if t != "" {
		switch t[len(t)-1] {
		case 'k':
			mult = 1 << 10
		case 'm':
			mult = 1 << 20
		case 'g':
			mult = 1 << 30
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q: want a number of bytes with an optional k, m or g", s)
	}
	return n * mult, nil
}

func formatBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "g"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "m"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "k"
	}
	return strconv.FormatInt(n, 10)
}

// labelString renders labels as k=v,k=v in key order, for logs.
func labelString(l map[string]string) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(l)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + l[k])
	}
	return b.String()
}
