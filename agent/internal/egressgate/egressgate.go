// Package egressgate decides on and serves the connections that a run's
// programs ask the sandbox's egress proxy for (see the runner's proxy and
// wire.Tunnels): the agent end of code mode's way out.
//
// Each run carries its own rules (codemode.execution.v1.Egress: host
// patterns and ports, and limits), set by the edge from the tenant's
// configuration and its policies. For every connection the agent checks
// the rules, resolves the name itself (the sandbox has no DNS), refuses
// addresses that are loopback, private, link-local or otherwise not public
// unless an address rule allows them, dials, and counts bytes and
// connections against the run's limits. A configured API, addressed as
// http://<name>.api.codemode/, is forwarded to its base URL with its
// credential, which never enters the sandbox: the answer passes through the
// API's apicatalog.Redactor (the credential in any form it finds is redacted from
// the status, headers and body, or the answer is a 502 for an API declared
// with refuse_echo), requests go without ranges, upgrades or trailers and
// ask for no compression, and informational (1xx) answers are dropped.
package egressgate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/codemode-go/codemode/agent/internal/wire"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/apicatalog"
	"github.com/codemode-go/codemode/internal/egressrule"
)

// APIHostSuffix ends the names by which code reaches configured APIs.
const APIHostSuffix = apicatalog.HostSuffix

// MaxRefusals is how many refusals a run's report lists.
const MaxRefusals = 16

// Limits are a run's egress limits; zero means none.
type Limits struct {
	Connections    int
	Bytes          int64
	ConnectionTime time.Duration
}

// Config configures a [Gate].
type Config struct {
	// Defaults apply to a run that leaves a limit at zero; Max bounds what
	// a run may ask for.
	Defaults, Max Limits
	// Hosts are names resolved without asking LookupNetIP.
	Hosts map[string][]netip.Addr
	// LookupNetIP resolves names; nil: net.DefaultResolver.
	LookupNetIP func(ctx context.Context, network, host string) ([]netip.Addr, error)
	// Dial dials; nil: a net.Dialer with DialTimeout.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// DialTimeout bounds resolving and dialing one connection.
	DialTimeout time.Duration
	// APIs are the configured APIs that code reaches at
	// http://<name>.api.codemode/; nil: none.
	APIs *apicatalog.Catalog
	// Deny lists addresses no rule can open: the agent's own listeners.
	Deny []netip.AddrPort
	Log  *slog.Logger
}

// Gate opens the egress of runs. It is safe for concurrent use.
type Gate struct {
	cfg     Config
	denyMu  sync.RWMutex
	deny    []netip.AddrPort
	apiSrv  *http.Server
	apiLn   *chanListener
	apiOnce sync.Once
}

// New returns a gate.
func New(cfg Config) *Gate {
	if cfg.LookupNetIP == nil {
		cfg.LookupNetIP = net.DefaultResolver.LookupNetIP
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.Dial == nil {
		d := &net.Dialer{}
		cfg.Dial = d.DialContext
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Gate{cfg: cfg, deny: cfg.Deny}
}

// Deny adds addresses that no rule opens.
func (g *Gate) Deny(addrs ...netip.AddrPort) {
	g.denyMu.Lock()
	g.deny = append(slices.Clip(g.deny), addrs...)
	g.denyMu.Unlock()
}

// Close stops forwarding to APIs.
func (g *Gate) Close() error {
	g.apiOnce.Do(func() {}) // none after this
	if g.apiSrv != nil {
		return g.apiSrv.Close()
	}
	return nil
}

// Begin returns the egress of one run with rules e (nil: nothing is
// allowed), for tenant and request id (for logs).
func (g *Gate) Begin(e *executionv1.Egress, tenant, requestID string) *Run {
	r := &Run{g: g, tenant: tenant, requestID: requestID, limits: g.limits(e.GetLimits())}
	for _, rule := range e.GetAllow() {
		if p, err := egressrule.Parse(rule); err == nil {
			r.rules = append(r.rules, p)
		} else {
			g.cfg.Log.Warn("egress rule ignored", "rule", rule.GetHost(), "error", err, "request_id", requestID)
		}
	}
	return r
}

func (g *Gate) limits(l *executionv1.EgressLimits) Limits {
	pick := func(v, def, max int64) int64 {
		if v <= 0 {
			v = def
		}
		if max > 0 && (v <= 0 || v > max) {
			v = max
		}
		return v
	}
	return Limits{
		Connections:    int(pick(int64(l.GetConnections()), int64(g.cfg.Defaults.Connections), int64(g.cfg.Max.Connections))),
		Bytes:          pick(int64(l.GetBytes()), g.cfg.Defaults.Bytes, g.cfg.Max.Bytes),
		ConnectionTime: time.Duration(pick(int64(l.GetConnectionTime().AsDuration()), int64(g.cfg.Defaults.ConnectionTime), int64(g.cfg.Max.ConnectionTime))),
	}
}

// Run is the egress of one run: a [wire.Egress].
type Run struct {
	g                 *Gate
	tenant, requestID string
	rules             []egressrule.Rule
	limits            Limits

	bytes atomic.Int64

	mu     sync.Mutex
	report executionv1.EgressReport
	opened int
}

// Report is what the run did through its egress; nil if it tried nothing.
func (r *Run) Report() *executionv1.EgressReport {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := &executionv1.EgressReport{
		Connections:   r.report.GetConnections(),
		Refused:       r.report.GetRefused(),
		BytesSent:     r.report.GetBytesSent(),
		BytesReceived: r.report.GetBytesReceived(),
		Refusals:      r.report.GetRefusals(),
		LimitReached:  r.report.GetLimitReached(),
	}
	if rep.Connections == 0 && rep.Refused == 0 {
		return nil
	}
	return rep
}

// refuse records a refusal and returns it.
func (r *Run) refuse(host string, port uint32, status int, limit executionv1.EgressLimit, format string, args ...any) error {
	reason := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.report.Refused++
	n := r.report.Refused
	if len(r.report.Refusals) < MaxRefusals {
		r.report.Refusals = append(r.report.Refusals, &executionv1.EgressRefusal{Host: host, Port: port, Reason: reason})
	}
	if limit != executionv1.EgressLimit_EGRESS_LIMIT_UNSPECIFIED && r.report.LimitReached == executionv1.EgressLimit_EGRESS_LIMIT_UNSPECIFIED {
		r.report.LimitReached = limit
	}
	r.mu.Unlock()
	// A program that retries in a loop is logged for its first refusals
	// only; the report counts them all.
	switch {
	case n <= MaxRefusals:
		r.g.cfg.Log.Info("egress refused", "tenant", r.tenant, "request_id", r.requestID, "host", host, "port", port, "status", status, "reason", reason)
	case n == MaxRefusals+1:
		r.g.cfg.Log.Info("egress refusals of this run are no longer logged", "tenant", r.tenant, "request_id", r.requestID)
	}
	return &wire.EgressRefusal{Status: status, Reason: reason}
}

func (r *Run) limitReached(l executionv1.EgressLimit) {
	r.mu.Lock()
	if r.report.LimitReached == executionv1.EgressLimit_EGRESS_LIMIT_UNSPECIFIED {
		r.report.LimitReached = l
	}
	r.mu.Unlock()
}

// Open decides on a connection to host:port (see [wire.Egress]).
func (r *Run) Open(ctx context.Context, host string, port uint32) (func(*wire.Tunnel), error) {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "" || port == 0 {
		return nil, r.refuse(host, port, http.StatusBadRequest, 0, "no host or port")
	}
	if r.limits.Bytes > 0 && r.bytes.Load() >= r.limits.Bytes {
		return nil, r.refuse(host, port, http.StatusTooManyRequests, executionv1.EgressLimit_EGRESS_LIMIT_BYTES,
			"the run's egress limit of %d bytes is reached", r.limits.Bytes)
	}
	r.mu.Lock()
	if r.limits.Connections > 0 && r.opened >= r.limits.Connections {
		r.mu.Unlock()
		return nil, r.refuse(host, port, http.StatusTooManyRequests, executionv1.EgressLimit_EGRESS_LIMIT_CONNECTIONS,
			"the run's egress limit of %d connections is reached", r.limits.Connections)
	}
	r.opened++ // released below if the connection is not opened
	r.mu.Unlock()
	serve, err := r.open(ctx, host, port)
	if err != nil {
		r.mu.Lock()
		r.opened--
		r.mu.Unlock()
		return nil, err
	}
	r.mu.Lock()
	r.report.Connections++
	r.mu.Unlock()
	return serve, nil
}

func (r *Run) open(ctx context.Context, host string, port uint32) (func(*wire.Tunnel), error) {
	if !r.allowsName(host, port) {
		if len(r.rules) == 0 {
			return nil, r.refuse(host, port, http.StatusForbidden, 0, "this run may not reach anything outside its sandbox (its egress allowlist is empty)")
		}
		return nil, r.refuse(host, port, http.StatusForbidden, 0, "%s is not in this run's egress allowlist", hostPort(host, port))
	}
	if strings.HasSuffix(host, APIHostSuffix) {
		return r.openAPI(host, port)
	}
	ctx, cancel := context.WithTimeout(ctx, r.g.cfg.DialTimeout)
	defer cancel()
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a.Unmap()}
	} else {
		found, ok := r.g.cfg.Hosts[host]
		var err error
		if !ok {
			found, err = r.g.cfg.LookupNetIP(ctx, "ip", host)
		}
		if err != nil {
			return nil, r.refuse(host, port, http.StatusBadGateway, 0, "cannot resolve %s", host)
		}
		for _, a := range found {
			addrs = append(addrs, a.Unmap())
		}
	}
	var allowed []netip.Addr
	var why string
	for _, a := range addrs {
		if r.g.denied(a, port) {
			why = fmt.Sprintf("%s is an address of the cluster itself", netip.AddrPortFrom(a, uint16(port)))
			continue
		}
		if kind := special(a); kind != "" && !r.allowsAddr(a, port) {
			why = fmt.Sprintf("%s resolves to %s, a %s address, which only an address rule allows", host, a, kind)
			continue
		}
		allowed = append(allowed, a)
	}
	if len(allowed) == 0 {
		if why == "" {
			why = "no address for " + host
		}
		return nil, r.refuse(host, port, http.StatusForbidden, 0, "%s", why)
	}
	var up net.Conn
	var err error
	for _, a := range allowed {
		up, err = r.g.cfg.Dial(ctx, "tcp", netip.AddrPortFrom(a, uint16(port)).String())
		if err == nil {
			break
		}
	}
	if err != nil {
		return nil, r.refuse(host, port, http.StatusBadGateway, 0, "cannot connect to %s: %s", hostPort(host, port), shortError(err))
	}
	start := time.Now()
	r.g.cfg.Log.Info("egress opened", "tenant", r.tenant, "request_id", r.requestID, "host", host, "port", port, "addr", up.RemoteAddr().String())
	return func(t *wire.Tunnel) {
		sent, received := r.splice(t, up)
		r.g.cfg.Log.Info("egress closed", "tenant", r.tenant, "request_id", r.requestID, "host", host, "port", port,
			"sent", sent, "received", received, "duration", time.Since(start).Round(time.Millisecond))
	}, nil
}

// splice copies between the program's tunnel and the far end, counting
// bytes against the run's limit and ending the connection at its time
// limit. It returns the bytes sent and received.
func (r *Run) splice(t *wire.Tunnel, up net.Conn) (sent, received int64) {
	defer t.Close()
	defer up.Close()
	if d := r.limits.ConnectionTime; d > 0 {
		timer := time.AfterFunc(d, func() {
			r.limitReached(executionv1.EgressLimit_EGRESS_LIMIT_CONNECTION_TIME)
			t.Close()
			up.Close()
		})
		defer timer.Stop()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var err error
		if sent, err = r.copy(up, t, true); err != nil {
			up.Close()
			t.Close()
		} else if cw, ok := up.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	}()
	var err error
	if received, err = r.copy(t, up, false); err != nil {
		up.Close()
		t.Close()
	} else {
		t.CloseWrite()
	}
	<-done
	return sent, received
}

var errByteLimit = errors.New("egress byte limit reached")

// copy copies src to dst until src ends, counting the bytes against the
// run's limit and into its report; it fails when the limit is passed.
func (r *Run) copy(dst net.Conn, src net.Conn, sent bool) (int64, error) {
	buf := make([]byte, 128<<10)
	var n int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			if !r.count(int64(k), sent) {
				return n, errByteLimit
			}
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return n, werr
			}
			n += int64(k)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return n, nil
			}
			return n, err
		}
	}
}

// openAPI serves a connection to a configured API: requests on it go to
// the API's base URL with its credential.
func (r *Run) openAPI(host string, port uint32) (func(*wire.Tunnel), error) {
	api, ok := r.g.cfg.APIs.ByHost(host)
	if !ok {
		return nil, r.refuse(host, port, http.StatusNotFound, 0, "no API named %q is configured", strings.TrimSuffix(host, APIHostSuffix))
	}
	if port != 80 {
		return nil, r.refuse(host, port, http.StatusForbidden, 0, "use http://%s/: the agent itself speaks TLS to the API", host)
	}
	r.g.cfg.Log.Info("egress opened", "tenant", r.tenant, "request_id", r.requestID, "host", host, "port", port, "api", api.Name)
	return func(t *wire.Tunnel) {
		r.g.serveAPI(&apiConn{Tunnel: t, run: r, api: api})
	}, nil
}

// allowsName reports whether a rule allows host (a name or an address
// literal) on port.
func (r *Run) allowsName(host string, port uint32) bool {
	for _, rl := range r.rules {
		if rl.MatchHost(host, port) {
			return true
		}
	}
	return false
}

// allowsAddr reports whether an address rule allows a on port.
func (r *Run) allowsAddr(a netip.Addr, port uint32) bool {
	for _, rl := range r.rules {
		if rl.MatchAddr(a, port) {
			return true
		}
	}
	return false
}

func (g *Gate) denied(a netip.Addr, port uint32) bool {
	g.denyMu.RLock()
	deny := g.deny
	g.denyMu.RUnlock()
	for _, d := range deny {
		if d.Port() != uint16(port) {
			continue
		}
		if d.Addr() == a || (d.Addr().IsLoopback() && a.IsLoopback()) ||
			(d.Addr().IsUnspecified() && (a.IsLoopback() || a.IsUnspecified() || isLocal(a))) {
			return true
		}
	}
	return false
}

// isLocal reports whether a is an address of this host's interfaces, as
// they were when first asked.
func isLocal(a netip.Addr) bool {
	_, ok := localAddrs()[a]
	return ok
}

// localAddrs are the addresses of this host's interfaces, read once.
var localAddrs = sync.OnceValue(func() map[netip.Addr]struct{} {
	m := make(map[netip.Addr]struct{})
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return m
	}
	for _, ia := range addrs {
		if p, err := netip.ParsePrefix(ia.String()); err == nil {
			m[p.Addr().Unmap()] = struct{}{}
		}
	}
	return m
})

// special names the kind of a non-public address; "" for a public one.
func special(a netip.Addr) string {
	switch {
	case a.IsLoopback():
		return "loopback"
	case a.IsPrivate():
		return "private"
	case a.IsLinkLocalUnicast(), a.IsLinkLocalMulticast():
		return "link-local"
	case a.IsUnspecified():
		return "unspecified"
	case a.IsMulticast():
		return "multicast"
	}
	for _, p := range reserved {
		if p.Contains(a) {
			return "reserved"
		}
	}
	return ""
}

// reserved are the ranges that are neither public nor caught above:
// shared address space (carrier-grade NAT), documentation, benchmarking,
// IETF protocol assignments, the IPv4 "this network" and future-use blocks,
// NAT64 and discard prefixes, and the metadata address of some clouds in
// IPv6.
var reserved = func() []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15",
		"198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4", "255.255.255.255/32",
		"64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32", "fd00:ec2::/32",
	} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}()

func hostPort(host string, port uint32) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// shortError is err's last part: the cause without the addresses of the
// agent's own sockets.
func shortError(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err.Error()
	}
	return err.Error()
}
