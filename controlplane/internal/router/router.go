// Package router knows the agents of one control plane and chooses which of
// them takes each run: only healthy agents whose labels match the run's
// route, the one with the most free capacity first, and always the same
// agent for the same session.
//
// Agents come from three places: addresses configured as IP:port, which are
// polled; names configured as host:port, resolved again every
// ResolveInterval with every address an agent (a headless service's name,
// say); and agents that register themselves with heartbeats (Register),
// which leave routing when three of their intervals pass without one and
// come back with the next.
//
// Which agent holds each session, and which sessions ended, live in a Store:
// this process's memory, or one that replicas share (Redis), together with
// the agents' heartbeats, so that any replica routes any session.
//
// A Router polls, resolves and expires in the background between Start and
// Close. All methods are safe for concurrent use.
package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/limits"
)

// ErrNoAgent is returned by Pick when no healthy agent matches the route.
var ErrNoAgent = errors.New("no healthy agent matches the route")

// ErrSessionGone is returned by PickSession for a session known to have
// ended (see Gone).
var ErrSessionGone = errors.New("the session has ended")

// Agent is one agent as the router tracks it.
type Agent struct {
	// Address is host:port.
	Address string
	// Client calls the agent.
	Client agentv1connect.AgentServiceClient

	mu sync.Mutex
	// polled: the router reads its status (a configured or resolved
	// address); otherwise its heartbeats bring the status.
	polled   bool
	status   *agentv1.AgentStatus
	healthy  bool
	lastErr  string
	inFlight int
	// reported is inFlight when the last status was read: the runs of
	// this router that the status counts as busy.
	reported int
	// expires, when set, is when the agent leaves routing unless a
	// heartbeat comes first.
	expires time.Time
	// lastSeen is the last heartbeat or successful status check.
	lastSeen time.Time
	now      func() time.Time
	// routed: the agent was in routing when last settled (see settleLocked).
	routed     bool
	membership *membership

	// credit orders agents of equal score (see Pick); guarded by the
	// Router's mu.
	credit int
}

// Snapshot is an agent's state at one moment.
type Snapshot struct {
	Address  string
	Healthy  bool
	Status   *agentv1.AgentStatus
	InFlight int
	Error    string
	// Registered: the agent joined by heartbeats.
	Registered bool
}

func (a *Agent) snapshot() Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settleLocked()
	healthy, lastErr := a.healthy, a.lastErr
	if a.expiredLocked() {
		healthy, lastErr = false, "missed its heartbeats"
	}
	return Snapshot{Address: a.Address, Healthy: healthy, Status: a.status, InFlight: a.inFlight, Error: lastErr, Registered: !a.expires.IsZero()}
}

// settleLocked counts the agent joining or leaving routing since it was
// last settled. Missed heartbeats are noticed here, when the agent is next
// considered or listed. a.mu is held.
func (a *Agent) settleLocked() {
	in := a.healthy && a.status != nil && !a.expiredLocked()
	if in == a.routed {
		return
	}
	a.routed = in
	if in {
		a.membership.joined.Add(1)
	} else {
		a.membership.left.Add(1)
	}
}

// expiredLocked reports whether the agent's heartbeats stopped. a.mu is held.
func (a *Agent) expiredLocked() bool {
	return !a.expires.IsZero() && !a.now().Before(a.expires)
}

// score is the agent's free capacity as the router sees it, out of its
// capacity: what the agent last reported, less the runs this router has
// started there since and plus those that ended since (the report counted
// them busy), and at most its capacity less this router's runs in flight.
func (a *Agent) score() (score, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.settleLocked()
	if !a.healthy || a.status == nil || a.expiredLocked() {
		return score{}, false
	}
	capacity := int(a.status.GetCapacity())
	free := int(a.status.GetFree()) - (a.inFlight - a.reported)
	if capacity > 0 {
		free = min(free, capacity-a.inFlight)
	}
	return score{free: free, capacity: max(capacity, 1)}, true
}

// score is free runs out of capacity; agents compare by the fraction, so
// that under load each gets runs in proportion to its capacity.
type score struct{ free, capacity int }

// cmp compares the fractions free/capacity of s and o.
func (s score) cmp(o score) int { return cmp.Compare(s.free*o.capacity, o.free*s.capacity) }

// near reports whether s is at most one run short of best: with one run
// more, best would be no freer than s. (A run on best's scale: on s's,
// an agent of small capacity that is full would be near one half free.)
func (s score) near(best score) bool {
	return s.free*best.capacity >= (best.free-1)*s.capacity
}

// Matches reports whether the agent has every label of labels.
func (a *Agent) Matches(labels map[string]string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	have := a.status.GetLabels()
	for k, v := range labels {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Acquire counts a run as sent to the agent until the returned function is called.
func (a *Agent) Acquire() (release func()) {
	a.mu.Lock()
	a.inFlight++
	a.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			a.inFlight--
			a.mu.Unlock()
		})
	}
}

// MarkDown records that a call to the agent failed for transport reasons,
// so that it is not picked until its next successful status check or
// heartbeat.
func (a *Agent) MarkDown(err error) {
	a.mu.Lock()
	a.healthy = false
	a.lastErr = err.Error()
	a.settleLocked()
	a.mu.Unlock()
}

// SessionTTL is how long the router remembers a session no run has used.
// It is longer than any session's idle timeout (at most the protos'
// ceiling), after which the agent has closed the session anyway.
const SessionTTL = limits.MaxSessionIdle + time.Hour

// Config configures a Router.
type Config struct {
	// Addresses of the agents, host:port. An IP address is polled as it
	// is; a name is resolved every ResolveInterval, and each of its
	// addresses is an agent.
	Addresses []string
	// PollInterval is how often each polled agent's status is read.
	PollInterval time.Duration
	// ResolveInterval is how often names in Addresses are resolved again;
	// 0: DefaultResolveInterval.
	ResolveInterval time.Duration
	// Resolver resolves names in Addresses; nil: net.DefaultResolver.
	Resolver Resolver
	// HTTPClient reaches the agents: h2c, or HTTP/2 over TLS.
	HTTPClient *http.Client
	// BaseURL is the base URL of the agent at host:port; nil: http://.
	BaseURL func(addr string) string
	// ClientOptions are passed to every agent client.
	ClientOptions []connect.ClientOption
	Logger        *slog.Logger
	// Now is the clock of heartbeats' expiry; nil: time.Now.
	Now func() time.Time
	// Store keeps session bindings and shares heartbeats with other
	// replicas; nil: a new Memory.
	Store Store
}

// Resolver resolves a host name to addresses. *net.Resolver is one.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

var _ Resolver = (*net.Resolver)(nil)

// DefaultResolveInterval is how often configured names are resolved again.
const DefaultResolveInterval = 5 * time.Second

// MissedHeartbeats is how many intervals may pass without a heartbeat
// before a registered agent leaves routing.
const MissedHeartbeats = 3

// ForgetAgentAfter is how long an agent that stopped sending heartbeats
// stays listed (unhealthy) before the router forgets it.
const ForgetAgentAfter = 10 * time.Minute

// Router chooses agents.
type Router struct {
	cfg     Config
	poll    time.Duration
	resolve time.Duration
	logger  *slog.Logger
	now     func() time.Time

	// static are the configured IP addresses; names the configured
	// names, host:port.
	static, names []string

	amu      sync.RWMutex
	agents   []*Agent            // in the order they became known
	byAddr   map[string]*Agent   // address -> agent
	resolved map[string][]string // name -> addresses it last gave

	mu    sync.Mutex // guards the agents' credit
	store Store
	// syncFailing: the last Sync could not read the store.
	syncFailing atomic.Bool

	membership membership

	stop chan struct{}
	done chan struct{}
}

// New returns a router over the configured agents. It does not contact them
// until Start or Refresh. With no addresses it routes only to agents that
// register.
func New(cfg Config) (*Router, error) {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.ResolveInterval <= 0 {
		cfg.ResolveInterval = DefaultResolveInterval
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Store == nil {
		cfg.Store = NewMemory()
	}
	r := &Router{
		cfg:      cfg,
		poll:     cfg.PollInterval,
		resolve:  cfg.ResolveInterval,
		logger:   cfg.Logger,
		now:      cfg.Now,
		byAddr:   map[string]*Agent{},
		resolved: map[string][]string{},
		store:    cfg.Store,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	seen := map[string]bool{}
	for _, addr := range cfg.Addresses {
		addr = strings.TrimSpace(addr)
		if addr == "" || seen[addr] {
			continue
		}
		seen[addr] = true
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("agent address %q: %w", addr, err)
		}
		if _, err := netip.ParseAddr(host); err != nil {
			r.names = append(r.names, addr)
			continue
		}
		r.static = append(r.static, addr)
		r.amu.Lock()
		r.addLocked(addr).polled = true
		r.amu.Unlock()
	}
	return r, nil
}

// addLocked returns the agent at addr, adding it if it is new. r.amu is held.
func (r *Router) addLocked(addr string) *Agent {
	if a, ok := r.byAddr[addr]; ok {
		return a
	}
	base := addr
	switch {
	case r.cfg.BaseURL != nil:
		base = r.cfg.BaseURL(addr)
	case !strings.Contains(base, "://"):
		base = "http://" + base
	}
	a := &Agent{
		Address:    addr,
		Client:     agentv1connect.NewAgentServiceClient(r.cfg.HTTPClient, base, r.cfg.ClientOptions...),
		now:        r.now,
		membership: &r.membership,
	}
	r.agents = append(r.agents, a)
	r.byAddr[addr] = a
	return a
}

// removeLocked drops the agent at addr from routing. Sessions bound to it
// keep their binding, and fail as their agent does. r.amu is held.
func (r *Router) removeLocked(addr string) {
	a, ok := r.byAddr[addr]
	if !ok {
		return
	}
	a.mu.Lock()
	if a.routed {
		a.routed = false
		r.membership.left.Add(1)
	}
	a.mu.Unlock()
	delete(r.byAddr, addr)
	r.agents = slices.DeleteFunc(r.agents, func(b *Agent) bool { return b == a })
}

// Start resolves and polls the agents, and reads those registered with
// other replicas, until Close: once now, synchronously, then in the
// background.
func (r *Router) Start(ctx context.Context) {
	r.Resolve(ctx)
	r.Refresh(ctx)
	r.Sync(ctx)
	go func() {
		defer close(r.done)
		poll := time.NewTicker(r.poll)
		defer poll.Stop()
		var resolve <-chan time.Time
		if len(r.names) > 0 {
			t := time.NewTicker(r.resolve)
			defer t.Stop()
			resolve = t.C
		}
		for {
			select {
			case <-r.stop:
				return
			case <-resolve:
				r.Resolve(ctx)
			case now := <-poll.C:
				r.Refresh(ctx)
				r.Sync(ctx)
				if err := r.store.Sweep(ctx, now.Add(-SessionTTL)); err != nil {
					r.logger.Warn("sweep sessions", "error", err)
				}
				r.forgetAgents(r.now().Add(-ForgetAgentAfter))
			}
		}
	}()
}

// Close stops polling.
func (r *Router) Close() {
	close(r.stop)
	<-r.done
}

// Resolve resolves the configured names now: each address of a name is an
// agent, and an address no name gives any more leaves routing. A name that
// fails to resolve keeps the addresses it had.
func (r *Router) Resolve(ctx context.Context) {
	if len(r.names) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	got := map[string][]string{}
	for _, name := range r.names {
		host, port, _ := net.SplitHostPort(name)
		ips, err := r.cfg.Resolver.LookupHost(ctx, host)
		if err != nil {
			r.logger.Warn("resolve agents", "name", name, "error", err)
			r.amu.RLock()
			got[name] = r.resolved[name] // keep what there was
			r.amu.RUnlock()
			continue
		}
		for _, ip := range ips {
			got[name] = append(got[name], net.JoinHostPort(ip, port))
		}
	}
	r.amu.Lock()
	defer r.amu.Unlock()
	was, now := map[string]bool{}, map[string]bool{}
	for _, addrs := range r.resolved {
		for _, addr := range addrs {
			was[addr] = true
		}
	}
	for _, addrs := range got {
		for _, addr := range addrs {
			now[addr] = true
		}
	}
	for addr := range now {
		if !was[addr] {
			r.logger.Info("agent resolved", "agent", addr)
		}
		a := r.addLocked(addr)
		a.mu.Lock()
		a.polled, a.expires = true, time.Time{}
		a.mu.Unlock()
	}
	for addr := range was {
		if !now[addr] && !slices.Contains(r.static, addr) {
			r.logger.Info("agent no longer resolved", "agent", addr)
			r.removeLocked(addr)
		}
	}
	r.resolved = got
}

// Register records a heartbeat of the agent at addr: its status now, and
// that it leaves routing unless another heartbeat comes within
// MissedHeartbeats intervals. An agent new to the router joins routing.
// The heartbeat is shared through the store with other replicas; the error
// is the store's.
func (r *Router) Register(ctx context.Context, addr string, status *agentv1.AgentStatus, interval time.Duration) error {
	r.amu.Lock()
	a, known := r.byAddr[addr]
	if !known {
		a = r.addLocked(addr)
	}
	r.amu.Unlock()
	now := r.now()
	a.mu.Lock()
	was := a.healthy && !a.expiredLocked()
	if !a.polled {
		// A polled agent's health is its status checks'; its heartbeats
		// only refresh the status.
		a.expires = now.Add(MissedHeartbeats * interval)
		a.healthy = status.GetReady()
		a.lastErr = ""
		if !a.healthy {
			a.lastErr = "agent reports not ready"
		}
	}
	a.status, a.reported = status, a.inFlight
	a.lastSeen = now
	a.settleLocked()
	is, lastErr := a.healthy && !a.expiredLocked(), a.lastErr
	a.mu.Unlock()
	if !known {
		r.membership.registered.Add(1)
		r.logger.Info("agent registered", "agent", addr, "name", status.GetName(), "healthy", is)
	} else if is != was {
		r.logger.Info("agent health changed", "agent", addr, "name", status.GetName(), "healthy", is, "error", lastErr)
	}
	return r.store.Heartbeat(ctx, AgentRecord{Address: addr, Status: status, Interval: interval, Seen: now})
}

// forgetAgents drops registered agents last heard from before cutoff.
func (r *Router) forgetAgents(cutoff time.Time) {
	r.amu.Lock()
	defer r.amu.Unlock()
	for _, a := range slices.Clone(r.agents) {
		a.mu.Lock()
		drop := !a.polled && a.lastSeen.Before(cutoff)
		a.mu.Unlock()
		if drop {
			r.logger.Info("agent forgotten", "agent", a.Address)
			r.removeLocked(a.Address)
		}
	}
}

// list returns the agents known now.
func (r *Router) list() []*Agent {
	r.amu.RLock()
	defer r.amu.RUnlock()
	return slices.Clone(r.agents)
}

// Refresh reads every polled agent's status now, concurrently.
func (r *Router) Refresh(ctx context.Context) {
	var wg sync.WaitGroup
	for _, a := range r.list() {
		a.mu.Lock()
		polled := a.polled
		a.mu.Unlock()
		if polled {
			wg.Go(func() { r.refresh(ctx, a) })
		}
	}
	wg.Wait()
}

func (r *Router) refresh(ctx context.Context, a *Agent) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second+r.poll)
	defer cancel()
	res, err := a.Client.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
	a.mu.Lock()
	defer a.mu.Unlock()
	was := a.healthy
	if err != nil {
		a.healthy = false
		a.lastErr = err.Error()
	} else {
		a.status, a.reported = res.Msg.GetStatus(), a.inFlight
		a.healthy = a.status.GetReady()
		a.lastErr = ""
		a.lastSeen = r.now()
		if !a.healthy {
			a.lastErr = "agent reports not ready"
		}
	}
	a.settleLocked()
	if was != a.healthy {
		r.logger.Info("agent health changed", "agent", a.Address, "healthy", a.healthy, "error", a.lastErr)
	}
}

// membership counts agents' comings and goings.
type membership struct{ registered, joined, left atomic.Uint64 }

// Membership counts, since the router was made, agents that registered
// (a heartbeat from an address it did not know, or had forgotten), and
// agents joining routing (a ready status) and leaving it (a failed status
// check or call, a status not ready, missed heartbeats: these noticed when
// the agent is next considered for a run or listed).
type Membership struct {
	Registered, Joined, Left uint64
}

// Membership returns the counts so far.
func (r *Router) Membership() Membership {
	return Membership{
		Registered: r.membership.registered.Load(),
		Joined:     r.membership.joined.Load(),
		Left:       r.membership.left.Load(),
	}
}

// Agents returns a snapshot of every agent.
func (r *Router) Agents() []Snapshot {
	agents := r.list()
	out := make([]Snapshot, 0, len(agents))
	for _, a := range agents {
		out = append(out, a.snapshot())
	}
	return out
}

// Pick returns a healthy agent matching labels, skipping those in exclude:
// among those with the largest part of their capacity free, or at most one
// run short of it, each in turn, with a share in proportion to its
// capacity.
//
// The run of slack is what makes shares follow capacity rather than speed.
// Free capacity counts whole runs: when a run ends, its agent is one run
// freer than the others, and a closed loop of callers (each sending its
// next run when the last one ends) would otherwise send every next run back
// to the agent the last one ended on, so that each agent's share would be
// its own speed. An agent two runs short of the best is left out: that is
// load.
func (r *Router) Pick(labels map[string]string, exclude ...*Agent) (*Agent, error) {
	var buf [16]candidate // no allocation for up to 16 agents
	cands := buf[:0]
	var best score
	r.amu.RLock()
	defer r.amu.RUnlock()
	for _, a := range r.agents {
		if slices.Contains(exclude, a) || !a.Matches(labels) {
			continue
		}
		s, ok := a.score()
		if !ok {
			continue
		}
		if len(cands) == 0 || s.cmp(best) > 0 {
			best = s
		}
		cands = append(cands, candidate{a, s})
	}
	if len(cands) == 0 {
		return nil, ErrNoAgent
	}
	// Smooth weighted round robin (as nginx balances upstreams): each
	// gains its capacity, the most credited is picked and pays the total,
	// so that shares follow capacity without runs in bursts.
	r.mu.Lock()
	defer r.mu.Unlock()
	var picked *Agent
	total := 0
	for _, c := range cands {
		if !c.score.near(best) {
			continue
		}
		c.agent.credit += c.score.capacity
		total += c.score.capacity
		if picked == nil || c.agent.credit > picked.credit {
			picked = c.agent
		}
	}
	picked.credit -= total
	return picked, nil
}

// candidate is an agent Pick may choose and its score.
type candidate struct {
	agent *Agent
	score score
}

// Session returns session id's binding and the agent holding it (nil for a
// tombstone), and false when the router knows nothing of it. It reads the
// store once. An agent the binding names that this router has not met (it
// joined through another replica) is added.
func (r *Router) Session(ctx context.Context, id string) (b Binding, a *Agent, ok bool, err error) {
	b, ok, err = r.store.Session(ctx, id)
	if err != nil || !ok {
		return Binding{}, nil, false, err
	}
	if b.ended() {
		return b, nil, true, nil
	}
	return b, r.agentAt(b.Agent), true, nil
}

// agentAt returns the agent at addr, adding it when it is new: a session's
// agent is reached whether or not this router has heard from it.
func (r *Router) agentAt(addr string) *Agent {
	r.amu.Lock()
	defer r.amu.Unlock()
	a, known := r.byAddr[addr]
	if !known {
		a = r.addLocked(addr)
		a.mu.Lock()
		a.lastSeen = r.now() // not forgotten at once
		a.mu.Unlock()
		r.logger.Info("agent of a session added", "agent", addr)
	}
	return a
}

// MarkGone records that session id ended for reason at ended, so that a
// later call for it is not_found with that reason rather than a new session.
func (r *Router) MarkGone(ctx context.Context, id string, reason executionv1.SessionNotFound_Reason, ended time.Time) error {
	return r.store.End(ctx, id, reason, ended)
}

// PickSession returns the agent holding session id, or picks one for the
// route and binds the session to it, atomically (across replicas sharing a
// store), so that concurrent first runs of a new session land on the same
// agent. A session that ended is ErrSessionGone, with its tombstone.
func (r *Router) PickSession(ctx context.Context, id, tenant string, labels map[string]string) (*Agent, Binding, error) {
	picked, err := r.Pick(labels)
	if err != nil {
		return nil, Binding{}, err
	}
	b, err := r.store.BindNew(ctx, id, Binding{Agent: picked.Address, Tenant: tenant})
	if err != nil {
		return nil, Binding{}, err
	}
	if b.ended() {
		return nil, b, ErrSessionGone
	}
	if b.Agent == picked.Address {
		return picked, b, nil
	}
	return r.agentAt(b.Agent), b, nil
}

// Bind records that agent a has confirmed it holds tenant's session id. A
// session known to have ended stays ended.
func (r *Router) Bind(ctx context.Context, id, tenant string, a *Agent) error {
	return r.store.Confirm(ctx, id, Binding{Agent: a.Address, Tenant: tenant, Confirmed: true})
}

// Sync reads the agents registered with other replicas from the store: an
// agent new to this router joins routing, and one whose heartbeat there is
// newer than any here takes that heartbeat's status and expiry. Polled
// agents keep their own checks.
func (r *Router) Sync(ctx context.Context) {
	recs, err := r.store.Agents(ctx)
	switch {
	case err != nil && ctx.Err() != nil:
		return // stopping
	case err != nil:
		if !r.syncFailing.Swap(true) { // once, not every poll
			r.logger.Warn("read agents from the store", "error", err)
		}
		return
	case r.syncFailing.Swap(false):
		r.logger.Info("agents read from the store again")
	}
	for _, rec := range recs {
		r.amu.Lock()
		a, known := r.byAddr[rec.Address]
		if !known {
			a = r.addLocked(rec.Address)
		}
		r.amu.Unlock()
		a.mu.Lock()
		if a.polled || (known && !rec.Seen.After(a.lastSeen)) {
			a.mu.Unlock()
			continue
		}
		was := known && a.healthy && !a.expiredLocked()
		a.expires = rec.Seen.Add(MissedHeartbeats * rec.Interval)
		a.healthy, a.lastErr = rec.Status.GetReady(), ""
		if !a.healthy {
			a.lastErr = "agent reports not ready"
		}
		a.status, a.reported = rec.Status, a.inFlight
		a.lastSeen = rec.Seen
		is := a.healthy && !a.expiredLocked()
		a.mu.Unlock()
		if !known {
			r.logger.Info("agent registered with another control plane", "agent", rec.Address, "name", rec.Status.GetName(), "healthy", is)
		} else if is != was {
			r.logger.Info("agent health changed", "agent", rec.Address, "name", rec.Status.GetName(), "healthy", is)
		}
	}
}

// All returns every agent, healthy or not.
func (r *Router) All() []*Agent { return r.list() }

// String describes the agent for logs.
func (a *Agent) String() string { return fmt.Sprintf("agent %s", a.Address) }
