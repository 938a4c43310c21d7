// Package edged is the edge's program: codemode's public door. On one port it
// serves the ExecutionService (gRPC, gRPC-Web, Connect), MCP at /mcp and,
// without code execution, at /no-code/mcp and /mcp-no-code-execute, and the
// web playground, all over one execution path that forwards to the control
// plane.
package edged

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/codemode-go/codemode/edge/internal/chat"
	"github.com/codemode-go/codemode/edge/internal/chatcompare"
	"github.com/codemode-go/codemode/edge/internal/connectapi"
	"github.com/codemode-go/codemode/edge/internal/directtools"
	"github.com/codemode-go/codemode/edge/internal/execution"
	"github.com/codemode-go/codemode/edge/internal/failover"
	"github.com/codemode-go/codemode/edge/internal/mcpserver"
	"github.com/codemode-go/codemode/edge/internal/oidctoken"
	"github.com/codemode-go/codemode/edge/internal/policy"
	"github.com/codemode-go/codemode/edge/internal/policytool"
	"github.com/codemode-go/codemode/edge/internal/ratelimit"
	"github.com/codemode-go/codemode/edge/internal/runapi"
	"github.com/codemode-go/codemode/edge/internal/tenant"
	"github.com/codemode-go/codemode/edge/web"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/apicatalog"
	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/cluster"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/telemetry"
	"github.com/codemode-go/codemode/internal/tlsconfig"
	"github.com/codemode-go/codemode/internal/version"
)

// ChatCommand is the first argument that selects the chat's commands
// (edge chat compare).
const ChatCommand = "chat"

// Config is the edge's configuration.
type Config struct {
	// Addr to listen on.
	Addr string
	// TLS are the files of the certificate chain and key (PEM) the edge
	// serves HTTPS with, read again when they change; both empty: plain
	// HTTP (h2c and HTTP/1.1).
	TLS tlsconfig.Files
	// ACME, with Hosts, gets the edge's certificates over ACME instead
	// (see tlsconfig.ACME).
	ACME tlsconfig.ACMEOptions
	// HTTPRedirectAddr, with TLS, is a second address (such as :80) where
	// every plain-HTTP request is redirected to https on Addr's port;
	// empty: none (plain HTTP to Addr is refused with 400).
	HTTPRedirectAddr string
	// ControlPlanes are the control planes' base URLs, e.g.
	// http://127.0.0.1:8080. With several, each call goes to the first
	// that takes it, and moves to the next only when it certainly did not
	// start (see internal/failover).
	ControlPlanes []string
	// APIKeys is a JSON file mapping API keys to tenant names; empty: no
	// authentication, every caller is the tenant "anonymous".
	APIKeys string
	// APIKeysJSON is the same mapping given in the environment
	// (CODEMODE_API_KEYS_JSON, never a flag): for orchestrators that hand
	// secrets to non-root containers as variables, since a mounted file
	// they can read is readable by its group too. Used when APIKeys is empty.
	APIKeysJSON string
	// OIDC is a JSON file naming the OpenID providers whose bearer tokens
	// the edge accepts beside API keys (see oidctoken.Config); empty: none.
	OIDC string
	// PublicURL is the edge's URL as its clients reach it
	// (https://codemode.example.com), which MCP's Protected Resource
	// Metadata names as the resource; empty: each request's scheme and
	// Host. Set it behind a proxy that terminates TLS.
	PublicURL string
	// Egress is a JSON file saying what each tenant's runs may reach
	// outside their sandboxes (see tenant.EgressConfig); empty: nothing.
	Egress string
	// PolicyConfig is the Wasm policy configuration file (see policies/ABI.md
	// and edge/internal/policy.Config); empty: no policies. It is reloaded
	// when it changes.
	PolicyConfig string
	// PolicyCacheDir keeps compiled policy modules across restarts; empty:
	// in memory only.
	PolicyCacheDir string
	// PolicyAdminToken enables the PolicyAdminService for callers that send
	// it as a bearer token; empty: the admin service refuses every call.
	PolicyAdminToken string
	// Links are how the edge calls the control planes (see cluster.Links):
	// their Secret is sent with every call and keys the mapping of session
	// ids (nil: none, a loopback-only deployment), over TLS with a cluster
	// CA. Nil: no secret, plain h2c.
	Links *cluster.Links
	// PublicWithoutKeys lets an edge with no API keys serve on an address
	// other than loopback: an open door where anyone who reaches it runs
	// code. Without it, such an edge serves on loopback only.
	PublicWithoutKeys bool
	// AllowedOrigins are the origins (scheme://host[:port], as browsers
	// send them in Origin) whose web pages may call the edge, "*" for all.
	// Pages the edge serves itself (the playground) always may. Empty: with
	// APIKeys every origin (a page then needs a key, which browsers never
	// attach on their own); without, none. A request from any other origin
	// is refused with 403 on every door, before it is read.
	AllowedOrigins []string
	// AllowedHosts are the host names (no port) the edge answers to, "*"
	// for any, besides IP addresses, localhost and the host name in Addr,
	// which it always answers to. Empty: with APIKeys any host name; without,
	// only those. A request to another host name (DNS rebinding) is refused
	// with 403 on every door.
	AllowedHosts []string
	// Limits bound request bodies (size and the time to send them), idle
	// connections and connections overall; see server.Limits. The zero
	// value bounds none of them.
	Limits server.Limits
	// Admission limits each tenant's calls in flight and per second; see
	// ratelimit.Config. The zero value limits nothing. API tool calls count
	// too.
	Admission ratelimit.Config
	// APIs is the API declaration file (see internal/apicatalog): its tools are
	// offered on /mcp-no-code-execute, and execute_code's description names
	// its APIs. Empty: the shipped declaration (GitHub's public API);
	// APIsNone: no APIs.
	APIs string
	// APITimeout bounds one API tool call; zero: directtools.DefaultTimeout.
	APITimeout time.Duration
	// APIMaxResponseBytes is how much of an API's answer a tool returns;
	// more is cut, saying so. Zero: directtools.DefaultMaxResponseBytes.
	APIMaxResponseBytes int64
	// MetricsAddr is the loopback address to serve Prometheus metrics on,
	// at /metrics; empty: none.
	MetricsAddr string
	// Tracing exports the edge's spans (see telemetry.NewTracing); nil:
	// none.
	Tracing *telemetry.Tracing
	// Chat configures the chat service's model (see internal/chat); no
	// provider: the ChatService and POST /chat answer failed_precondition.
	Chat chat.Config
}

// APIsNone as Config.APIs declares no APIs.
const APIsNone = apicatalog.None

// Defaults.
const (
	DefaultAddr         = ":8000"
	DefaultControlPlane = "http://127.0.0.1:8080"
)

// oidcFetchTimeout bounds one fetch of an issuer's discovery document or
// keys.
const oidcFetchTimeout = 10 * time.Second

// policyWatchInterval is how often the policy configuration file is checked.
const policyWatchInterval = 2 * time.Second

// Validate reports whether the configuration can be used.
func (c Config) Validate() error {
	var errs []error
	if c.Addr == "" {
		errs = append(errs, errors.New("addr is empty"))
	}
	if len(c.ControlPlanes) == 0 {
		errs = append(errs, errors.New("no control plane"))
	}
	for _, cp := range c.ControlPlanes {
		u, err := url.Parse(cp)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("control plane URL: %w", err))
		case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
			errs = append(errs, fmt.Errorf("control plane URL %q: want http://host:port or https://host:port", cp))
		case u.Path != "" && u.Path != "/" && len(c.ControlPlanes) > 1:
			errs = append(errs, fmt.Errorf("control plane URL %q: several control planes take no path", cp))
		}
	}
	if c.PublicURL != "" {
		if u, err := url.Parse(c.PublicURL); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || strings.Trim(u.Path, "/") != "" {
			errs = append(errs, fmt.Errorf("public URL %q: want scheme://host[:port], no path", c.PublicURL))
		}
	}
	if err := c.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.browsers().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("allowed origins and hosts: %w", err))
	}
	if err := c.Admission.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.APITimeout < 0 {
		errs = append(errs, fmt.Errorf("api timeout %s is negative", c.APITimeout))
	}
	if c.APIMaxResponseBytes < 0 {
		errs = append(errs, fmt.Errorf("api max response bytes %d is negative", c.APIMaxResponseBytes))
	}
	if err := c.Chat.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// keyed says whether callers must present API keys.
func (c Config) keyed() bool { return c.APIKeys != "" || c.APIKeysJSON != "" }

// tenants resolves API keys: from the APIKeys file, else from APIKeysJSON.
func (c Config) tenants() (*tenant.Resolver, error) {
	if c.APIKeys != "" || c.APIKeysJSON == "" {
		return tenant.Load(c.APIKeys)
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(c.APIKeysJSON), &m); err != nil {
		return nil, fmt.Errorf("parse %s: %w", APIKeysJSONEnv, err)
	}
	r, err := tenant.New(m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", APIKeysJSONEnv, err)
	}
	return r, nil
}

// APIKeysJSONEnv holds the API keys themselves (see Config.APIKeysJSON).
const APIKeysJSONEnv = "CODEMODE_API_KEYS_JSON"

// tlsConfig is the configuration of the edge's listener: from the
// certificate files, or over ACME; nil: plain HTTP.
func (c Config) tlsConfig(log *slog.Logger) (*tls.Config, error) {
	if len(c.ACME.Hosts) == 0 {
		return c.TLS.Server(log)
	}
	if c.TLS != (tlsconfig.Files{}) {
		return nil, errors.New("--acme-hosts and --tls-cert: give one or the other")
	}
	o := c.ACME
	o.Logger = log
	tc, err := tlsconfig.ACME(o)
	if err != nil {
		return nil, fmt.Errorf("--acme-hosts: %w", err)
	}
	return tc, nil
}

// ParseControlPlanes splits a comma-separated list of control planes,
// taking host:port as links would (see cluster.Links.URL: https:// with a
// cluster CA, http:// without).
func ParseControlPlanes(s string, links *cluster.Links) []string {
	var out []string
	for _, f := range ParseList(s) {
		out = append(out, links.URL(f))
	}
	return out
}

// ParseList splits a comma-separated list, dropping empty items.
func ParseList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// browsers says which pages may call the edge and under which host names
// (see Config.AllowedOrigins and Config.AllowedHosts). Without API keys,
// a page that reaches the edge would run code as the edge's one tenant; with
// them, it needs a key the browser never sends on its own, so the defaults
// open up.
func (c Config) browsers() server.Browsers {
	b := server.Browsers{Origins: c.AllowedOrigins, Hosts: c.AllowedHosts}
	if c.authenticates() {
		if len(b.Origins) == 0 {
			b.Origins = []string{"*"}
		}
		if len(b.Hosts) == 0 {
			b.Hosts = []string{"*"}
		}
	}
	// The names the edge gets certificates for are its own.
	b.Hosts = append(slices.Clip(b.Hosts), c.ACME.Hosts...)
	// An IP address is always answered; a name in Addr is the edge's own.
	if host, _, err := net.SplitHostPort(c.Addr); err == nil && host != "" && net.ParseIP(host) == nil {
		b.Hosts = append(slices.Clip(b.Hosts), host)
	}
	return b
}

// authenticates reports whether every caller must show a credential: an
// API key or a token.
func (c Config) authenticates() bool { return c.keyed() || c.OIDC != "" }

// controlPlaneClient is the client of the control planes at urls over
// links: with several, each call goes to the first that takes it (see
// internal/failover), and every URL reaches it.
func controlPlaneClient(urls []string, links *cluster.Links, logger *slog.Logger) (*http.Client, error) {
	c := links.Client(server.NewClient())
	if len(urls) < 2 {
		return c, nil
	}
	t, err := failover.New(urls, c.Transport, logger.With("component", "failover"))
	if err != nil {
		return nil, err
	}
	c.Transport = t
	return c, nil
}

// Run is the edge program. With the first argument mcp-stdio it serves
// MCP over stdio instead (see RunStdio); with policy, it checks, runs or
// times a policy module (see policytool.Run).
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == StdioCommand {
		return RunStdio(ctx, args[1:], stdin, stdout, stderr)
	}
	if len(args) > 0 && args[0] == server.HealthCommand {
		return server.RunHealthCheck(ctx, "edge", args[1:], DefaultAddr, "EDGE_ADDR", os.Getenv, stdout, stderr)
	}
	if len(args) > 0 && args[0] == policytool.Command {
		return policytool.Run(ctx, args[1:], stdin, stdout, stderr)
	}
	if len(args) > 0 && args[0] == ChatCommand {
		return chatcompare.RunChat(ctx, args[1:], stdout, stderr)
	}
	fs := cli.NewFlags("edge", stderr)
	readConfig := configFlags(fs)
	loadLinks := cluster.LinkFlags(fs)
	logFormat, logLevel := cli.LogFlags(fs)
	metricsAddr := telemetry.MetricsFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage:\n  %-24s serve the API, MCP and the web page\n  %-24s serve MCP over stdio, forwarding to an edge (see edge %s --help)\n  %-24s check, run or time a policy module (see edge %s --help)\n  %-24s compare code mode with direct tools through an edge's chat (see edge %s %s --help)\n  %-24s ask the edge at --addr whether it serves (exit 0) or not\n  %-24s print the version\n\nFlags:\n",
			"edge [flags]", "edge "+StdioCommand+" [flags]", StdioCommand, "edge "+policytool.Command+" COMMAND", policytool.Command,
			"edge "+ChatCommand+" "+chatcompare.Command, ChatCommand, chatcompare.Command,
			"edge "+server.HealthCommand+" [--addr A]", "edge --version")
		fs.PrintDefaults()
	}
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
	cfg := readConfig(links)
	cfg.Links, cfg.MetricsAddr, cfg.APIKeysJSON = links, *metricsAddr, os.Getenv(APIKeysJSONEnv)
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	if cfg.Addr, err = bindAddr(cfg); err != nil {
		return err
	}
	if secret == nil {
		logger.Warn("no cluster secret: calls to the control plane are not authenticated; deploy the internal services on loopback only")
	}
	var stopTracing func()
	if cfg.Tracing, stopTracing, err = telemetry.StartTracing(ctx, telemetry.ServiceEdge, logger); err != nil {
		return err
	}
	defer stopTracing()
	ln, err := server.Listen(ctx, cfg.Addr)
	if err != nil {
		return err
	}
	if cfg.HTTPRedirectAddr != "" {
		stop, err := serveRedirect(ctx, cfg, ln, logger.With("component", "redirect"))
		if err != nil {
			ln.Close()
			return err
		}
		defer stop()
	}
	return Serve(ctx, cfg, ln, logger.With("component", "edge"))
}

// serveRedirect serves cfg.HTTPRedirectAddr, redirecting to https on ln's
// port, until the returned function is called.
func serveRedirect(ctx context.Context, cfg Config, ln net.Listener, logger *slog.Logger) (stop func(), err error) {
	if cfg.TLS == (tlsconfig.Files{}) && len(cfg.ACME.Hosts) == 0 {
		return nil, errors.New("--http-redirect-addr redirects to https: give the edge --tls-cert and --tls-key, or --acme-hosts")
	}
	rln, err := server.Listen(ctx, cfg.HTTPRedirectAddr)
	if err != nil {
		return nil, fmt.Errorf("--http-redirect-addr: %w", err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := server.ServeRedirect(ctx, rln, port, logger); err != nil {
			logger.Error("redirect listener failed", "error", err)
		}
	}()
	return func() { cancel(); <-done }, nil
}

// configFlags declares the edge's flags but those of the cluster secret,
// the log and the metrics, each with its environment variable, and
// returns what reads them into a Config once they are parsed.
func configFlags(fs *cli.Flags) func(*cluster.Links) Config {
	addr := fs.String("addr", DefaultAddr, "address to serve the API, MCP and the web page on")
	fs.Env("addr", "EDGE_ADDR")
	tlsFiles := tlsconfig.Flags(fs)
	acmeOptions := tlsconfig.ACMEFlags(fs)
	redirect := fs.String("http-redirect-addr", "", "with --tls-cert or --acme-hosts, also listen here (such as :80) and redirect every plain-HTTP request to https on --addr's port; empty: none")
	fs.Env("http-redirect-addr", "CODEMODE_HTTP_REDIRECT_ADDR")
	cp := fs.String("controlplane", DefaultControlPlane, "control plane base URL (host:port is taken as http://host:port); several, comma-separated: calls go to the first that accepts a connection and move to the next only when one refuses it (a run is never sent twice)")
	fs.Env("controlplane", "CODE_EXECUTION_HOST")
	keys := fs.String("api-keys", "", "JSON file mapping API keys to tenant names, mode 0600 or 0400 (one its group or others may read or write is refused); or the mapping itself in CODEMODE_API_KEYS_JSON; empty for no authentication")
	fs.Env("api-keys", "CODEMODE_API_KEYS")
	oidcConfig := fs.String("oidc-config", "", "JSON file naming the OpenID providers whose bearer tokens (JWT access tokens) are accepted beside API keys: issuer, audiences, tenant claim and its allow-list, scopes (see docs/identity.md); empty for none")
	fs.Env("oidc-config", "CODEMODE_OIDC_CONFIG")
	publicURL := fs.String("public-url", "", "the edge's URL as clients reach it (https://codemode.example.com), named as the resource in MCP's OAuth metadata; empty: each request's scheme and host")
	fs.Env("public-url", "CODEMODE_PUBLIC_URL")
	egressConfig := fs.String("egress", "", "JSON file saying what each tenant's runs may reach outside their sandboxes (hosts, ports, limits); empty: nothing")
	fs.Env("egress", "CODEMODE_EGRESS")
	policyConfig := fs.String("policy-config", "", "Wasm policy configuration file (JSON), reloaded when it changes; empty for no policies")
	fs.Env("policy-config", "CODEMODE_POLICY_CONFIG")
	policyCache := fs.String("policy-cache-dir", "", "directory that keeps compiled policy modules across restarts; empty for memory only")
	fs.Env("policy-cache-dir", "CODEMODE_POLICY_CACHE_DIR")
	policyToken := fs.String("policy-admin-token", "", "bearer token of the PolicyAdminService; empty disables it")
	fs.Env("policy-admin-token", "CODEMODE_POLICY_ADMIN_TOKEN")
	public := fs.Bool("public-without-keys", false, "serve on addresses other than loopback even with no --api-keys: anyone who reaches the edge runs code")
	fs.Env("public-without-keys", "CODEMODE_PUBLIC_WITHOUT_KEYS")
	origins := fs.String("allowed-origins", "", "comma-separated origins (scheme://host[:port]) whose web pages may call the edge, * for all; the edge's own pages always may. Empty: all with --api-keys, none without")
	fs.Env("allowed-origins", "CODEMODE_ALLOWED_ORIGINS")
	hosts := fs.String("allowed-hosts", "", "comma-separated host names (no port) the edge answers to besides IP addresses, localhost and the --addr host, * for any; others are refused (DNS rebinding). Empty: any with --api-keys, none without")
	fs.Env("allowed-hosts", "CODEMODE_ALLOWED_HOSTS")
	maxBytes := fs.Int64("max-request-bytes", server.DefaultMaxRequestBytes, "largest request body, in bytes, on every door: Connect, gRPC and gRPC-Web answer resource_exhausted, MCP and HTTP 413; 0 for no limit")
	fs.Env("max-request-bytes", "CODEMODE_MAX_REQUEST_BYTES")
	bodyTimeout := fs.Duration("body-timeout", server.DefaultBodyTimeout, "time a client has to send a request's body (not to wait for the answer); 0 for no limit")
	fs.Env("body-timeout", "CODEMODE_BODY_TIMEOUT")
	idleTimeout := fs.Duration("idle-timeout", server.DefaultIdleTimeout, "close connections with no request in flight for this long; 0 to keep them")
	fs.Env("idle-timeout", "CODEMODE_IDLE_TIMEOUT")
	maxConns := fs.Int("max-conns", server.DefaultMaxConns, "connections served at once; more wait to be accepted; 0 for no cap")
	fs.Env("max-conns", "CODEMODE_MAX_CONNS")
	largeBodies := fs.Int("large-bodies", server.DefaultLargeBodies, "requests that may read a body over 1 MiB at once, bounding the memory bodies take; others wait their turn within --body-timeout; 0 for no limit")
	fs.Env("large-bodies", "CODEMODE_LARGE_BODIES")
	tenantConcurrency := fs.Int("tenant-concurrency", ratelimit.DefaultConcurrency, "calls (runs, sessions, files) of one tenant in flight at once; more are refused with resource_exhausted; 0 for no limit")
	fs.Env("tenant-concurrency", "CODEMODE_TENANT_CONCURRENCY")
	tenantRate := fs.Float64("tenant-rate", ratelimit.DefaultRate, "calls of one tenant per second, on average; more are refused with resource_exhausted; 0 for no limit")
	fs.Env("tenant-rate", "CODEMODE_TENANT_RATE")
	tenantBurst := fs.Int("tenant-burst", ratelimit.DefaultBurst, "calls of one tenant that may start at once above --tenant-rate, after a quiet spell; at least 1 when --tenant-rate is set")
	fs.Env("tenant-burst", "CODEMODE_TENANT_BURST")
	apisFile := fs.String("apis", "", "JSON file declaring the HTTP APIs offered as tools on /mcp-no-code-execute and named to code on /mcp (see internal/apicatalog); empty for the shipped declaration (GitHub's public API, token from CODEMODE_GITHUB_TOKEN if set), \""+APIsNone+"\" for none")
	fs.Env("apis", "CODEMODE_APIS")
	apiTimeout := fs.Duration("api-timeout", directtools.DefaultTimeout, "time one API tool call may take, answer included")
	fs.Env("api-timeout", "CODEMODE_API_TIMEOUT")
	apiMaxBytes := fs.Int64("api-max-response-bytes", directtools.DefaultMaxResponseBytes, "bytes of an API's answer an API tool returns; more is cut, saying so")
	fs.Env("api-max-response-bytes", "CODEMODE_API_MAX_RESPONSE_BYTES")
	readChat := chat.Flags(fs)
	return func(links *cluster.Links) Config {
		return Config{Chat: readChat(), Addr: *addr, TLS: tlsFiles(), ACME: acmeOptions(), HTTPRedirectAddr: *redirect, ControlPlanes: ParseControlPlanes(*cp, links), APIKeys: *keys, OIDC: *oidcConfig, PublicURL: *publicURL, Egress: *egressConfig,
			PolicyConfig: *policyConfig, PolicyCacheDir: *policyCache, PolicyAdminToken: *policyToken,
			PublicWithoutKeys: *public, AllowedOrigins: ParseList(*origins), AllowedHosts: ParseList(*hosts),
			Limits:    server.Limits{MaxRequestBytes: *maxBytes, BodyTimeout: *bodyTimeout, IdleTimeout: *idleTimeout, MaxConns: *maxConns, LargeBodies: *largeBodies},
			Admission: ratelimit.Config{Concurrency: *tenantConcurrency, Rate: *tenantRate, Burst: *tenantBurst},
			APIs:      *apisFile, APITimeout: *apiTimeout, APIMaxResponseBytes: *apiMaxBytes}
	}
}

// bindAddr returns the address the edge may serve on: any address when it
// has API keys or is told to be public, else loopback only.
func bindAddr(cfg Config) (string, error) {
	if cfg.authenticates() || cfg.PublicWithoutKeys {
		return cfg.Addr, nil
	}
	a, err := cluster.LoopbackAddr(cfg.Addr)
	if errors.Is(err, cluster.ErrNotLoopback) {
		return "", fmt.Errorf("edge: refusing to serve on %s with no API keys: anyone who reaches it could run code. "+
			"Give the edge --api-keys FILE (CODEMODE_API_KEYS), serve on a loopback address such as 127.0.0.1:8000, "+
			"or pass --public-without-keys (CODEMODE_PUBLIC_WITHOUT_KEYS=true) if an open door is what you want", cfg.Addr)
	}
	return a, err
}

// needsKey reports whether a request to path needs an API key: every door
// that runs code or touches a session does. The web page, health checks,
// reflection and the policy admin service (which has its own token) do not.
func needsKey(path string) bool {
	return strings.HasPrefix(path, "/"+edgev1connect.ExecutionServiceName+"/") ||
		strings.HasPrefix(path, "/"+edgev1connect.ChatServiceName+"/") ||
		path == "/mcp" || path == "/no-code/mcp" || path == "/mcp-no-code-execute" || path == "/run" || path == "/status" || path == "/chat"
}

// rightFor is the right a request to path needs (see needsKey): each
// Connect method its own, /run and /mcp running code, /status reading,
// the MCP door without code execution calling APIs. What a call does
// beyond its door (a run in a session, MCP's session tools) is checked
// where it is known.
func rightFor(path string) oidctoken.Rights {
	switch path {
	case edgev1connect.ExecutionServiceExecuteProcedure, edgev1connect.ExecutionServiceExecuteStreamProcedure, "/run", "/mcp",
		edgev1connect.ChatServiceChatProcedure, "/chat":
		return oidctoken.Execute
	case edgev1connect.ExecutionServiceCreateSessionProcedure, edgev1connect.ExecutionServiceCloseSessionProcedure,
		edgev1connect.ExecutionServiceListFilesProcedure, edgev1connect.ExecutionServiceReadFileProcedure,
		edgev1connect.ExecutionServiceWriteFileProcedure:
		return oidctoken.Sessions
	case "/no-code/mcp", "/mcp-no-code-execute":
		return oidctoken.APIs
	}
	return oidctoken.Read
}

// Serve serves the edge on ln until ctx is done.
func Serve(ctx context.Context, cfg Config, ln net.Listener, logger *slog.Logger) error {
	p, err := cfg.load(logger)
	if err != nil {
		ln.Close()
		return err
	}
	var svc *execution.Service // set before anything is served
	knownLanguage := func(name string) bool { return svc.KnownLanguage(name) }
	metrics := telemetry.NewMetrics()
	policies, err := startPolicies(ctx, cfg, metrics, knownLanguage, logger)
	if err != nil {
		ln.Close()
		return err
	}
	defer policies.Close(context.WithoutCancel(ctx))
	limits := ratelimit.New(cfg.Admission)
	if err := metrics.StartMetrics(ctx, cfg.MetricsAddr, logger.With("component", "metrics")); err != nil {
		ln.Close()
		return err
	}
	svc = execution.New(p.cp, logger, execution.WithPolicies(policies), execution.WithSessionKey(cfg.Links.SecretOrNil().Key(execution.SessionKeyPurpose)),
		execution.WithAdmission(limits), execution.WithEgress(p.egress), execution.WithMetrics(metrics))
	calls := directtools.New(logger.With("component", "apicall"), directtools.WithPolicies(policies), directtools.WithAdmission(limits),
		directtools.WithTimeout(cfg.APITimeout), directtools.WithMaxResponseBytes(cfg.APIMaxResponseBytes))
	srv, err := cfg.server(p, svc, calls, policies, metrics, logger)
	if err != nil {
		ln.Close()
		return err
	}
	return srv.Serve(ctx, ln)
}

// parts are what the edge is built from, read from its configuration
// before anything runs.
type parts struct {
	tls     *tls.Config
	tenants *tenant.Resolver
	egress  *tenant.EgressConfig
	catalog *apicatalog.Catalog
	cp      controlplanev1connect.ControlPlaneServiceClient
}

// load reads the edge's certificates, tenants, egress and declared APIs,
// and makes its client of the control planes.
func (c Config) load(logger *slog.Logger) (parts, error) {
	var p parts
	var err error
	if p.tls, err = c.tlsConfig(logger.With("component", "tls")); err != nil {
		return parts{}, err
	}
	if p.tenants, err = c.tenantsWithTokens(logger); err != nil {
		return parts{}, err
	}
	if p.egress, err = tenant.LoadEgress(c.Egress); err != nil {
		return parts{}, err
	}
	if p.catalog, err = apicatalog.FromFlag(c.APIs); err != nil {
		return parts{}, err
	}
	cpClient, err := controlPlaneClient(c.ControlPlanes, c.Links, logger)
	if err != nil {
		return parts{}, err
	}
	p.cp = controlplanev1connect.NewControlPlaneServiceClient(cpClient, strings.TrimRight(c.ControlPlanes[0], "/"),
		c.Tracing.ClientOptions()...)
	return p, nil
}

// tenantsWithTokens is tenants, taking OIDC tokens as well when c.OIDC
// names their configuration.
func (c Config) tenantsWithTokens(logger *slog.Logger) (*tenant.Resolver, error) {
	tenants, err := c.tenants()
	if err != nil || c.OIDC == "" {
		return tenants, err
	}
	oc, err := oidctoken.Load(c.OIDC)
	if err != nil {
		return nil, err
	}
	v, err := oidctoken.New(oc, &http.Client{Timeout: oidcFetchTimeout}, logger.With("component", "oidc"))
	if err != nil {
		return nil, fmt.Errorf("oidc config: %w", err)
	}
	return tenants.WithTokens(v, oc)
}

// startPolicies loads the policies, registers their metrics, and watches
// their configuration until ctx is done.
func startPolicies(ctx context.Context, cfg Config, metrics *telemetry.Metrics, knownLanguage func(string) bool, logger *slog.Logger) (*policy.Engine, error) {
	policyMetrics := policy.NewMetrics()
	metrics.MustRegister(policyMetrics)
	policies, err := policy.New(ctx, policy.Options{ConfigPath: cfg.PolicyConfig, CacheDir: cfg.PolicyCacheDir, KnownLanguage: knownLanguage, Logger: logger,
		Metrics: policyMetrics})
	if err != nil {
		return nil, fmt.Errorf("load policies: %w", err)
	}
	go policies.Watch(ctx, policyWatchInterval)
	return policies, nil
}

// server mounts every door of the edge: the ExecutionService, the
// policies' admin service, chat, MCP, POST /run, /status and the
// playground.
func (c Config) server(p parts, svc *execution.Service, calls *directtools.Service, policies *policy.Engine,
	metrics *telemetry.Metrics, logger *slog.Logger) (*server.Server, error) {
	srv := server.New(logger)
	srv.Limits = c.Limits
	srv.TLS = p.tls
	srv.OnInvalid = metrics.ObserveInvalid
	browsers := c.browsers()
	srv.Browsers = &browsers
	mcpAuth := newMCPAuth(c.PublicURL, p.tenants.Tokens())
	srv.Authenticate = authenticate(p.tenants, mcpAuth)
	if mcpAuth != nil {
		mcpAuth.handle(srv.Handle)
	}
	srv.HandleService(policy.NewAdminHandler(policies, c.PolicyAdminToken, srv.HandlerOptions()...))
	srv.HandleService(edgev1connect.NewExecutionServiceHandler(connectapi.New(svc, p.tenants), srv.HandlerOptions(c.Tracing.HandlerOptions()...)...))
	servers := mcpserver.New(mcpserver.Config{Open: mcpserver.Local(svc, calls, p.tenants), Logger: logger.With("component", "mcp"),
		Version: version.Version(), APIs: p.catalog, Egress: p.egress, Tracing: c.Tracing, Metrics: metrics})
	withCode, withoutCode := servers.Handlers()
	chats, err := chat.New(c.Chat, servers, os.Getenv, logger.With("component", "chat"))
	if err != nil {
		return nil, err
	}
	chatHandler := chat.NewHandler(chats)
	srv.HandleService(edgev1connect.NewChatServiceHandler(chatHandler, srv.HandlerOptions(c.Tracing.HandlerOptions()...)...))
	srv.Handle("/chat", c.Tracing.Handler("/chat", chatHandler.HTTPHandler()))
	srv.HandleTooLarge("/mcp", c.Tracing.Handler("/mcp", withCode), mcpserver.RefuseTooLarge)
	// The tools without code execution at two paths: /no-code/mcp for
	// clients that take any URL not ending in /mcp for a mistake and
	// rewrite it (the MCP Inspector's CLI does), /mcp-no-code-execute as
	// before. One handler: a session opened at one path goes on at the
	// other.
	for _, path := range []string{"/no-code/mcp", "/mcp-no-code-execute"} {
		srv.HandleTooLarge(path, c.Tracing.Handler(path, withoutCode), mcpserver.RefuseTooLarge)
	}
	srv.Handle("/run", c.Tracing.Handler("/run", runapi.RunHandler(svc)))
	srv.Handle("/status", runapi.StatusHandler(svc))
	srv.Handle("/", web.Handler(webOptions(p.tenants)...))
	return srv, nil
}

// webOptions let the playground sign in with the tenants' OIDC issuers,
// when one has a client for it.
func webOptions(tenants *tenant.Resolver) []web.Option {
	v := tenants.Tokens()
	if v == nil {
		return nil
	}
	return []web.Option{web.WithSignIn(func(ctx context.Context) (any, string, error) {
		s, ok, err := v.SignIn(ctx)
		if !ok {
			return nil, "", nil // no issuer has a client for the playground
		}
		return s, s.TokenEndpoint, err
	})}
}
