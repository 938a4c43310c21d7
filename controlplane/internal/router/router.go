// Package router knows the agents of one control plane and chooses which of
// them takes each run: only healthy agents whose labels match the run's
// route, the one with the most free capacity first, and always the same
// agent for the same session.
//
// A Router polls every agent's Status in the background between Start and
// Close. All methods are safe for concurrent use.
package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
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

	mu       sync.Mutex
	status   *agentv1.AgentStatus
	healthy  bool
	lastErr  string
	inFlight int
}

// Snapshot is an agent's state at one moment.
type Snapshot struct {
	Address  string
	Healthy  bool
	Status   *agentv1.AgentStatus
	InFlight int
	Error    string
}

func (a *Agent) snapshot() Snapshot {
	a.mu.Lock()
	defer a.mu.Unlock()
	return Snapshot{Address: a.Address, Healthy: a.healthy, Status: a.status, InFlight: a.inFlight, Error: a.lastErr}
}

// score is the agent's free capacity as the router sees it: what the agent
// reported less the runs this router sent since.
func (a *Agent) score() (int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.healthy || a.status == nil {
		return 0, false
	}
	return int(a.status.GetFree()) - a.inFlight, true
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
// so that it is not picked until its next successful status check.
func (a *Agent) MarkDown(err error) {
	a.mu.Lock()
	a.healthy = false
	a.lastErr = err.Error()
	a.mu.Unlock()
}

// binding is a session's agent and when the router last routed to it.
type binding struct {
	agent *Agent
	used  time.Time
	// confirmed: the agent has said it holds the session (a run, a file
	// call or the creation succeeded). A confirmed session that the agent
	// no longer knows was lost with it.
	confirmed bool
	// gone, when set, says why the session ended; the binding is then a
	// tombstone, kept for SessionTTL so that the id is never reborn.
	gone  executionv1.SessionNotFound_Reason
	ended time.Time
}

// SessionTTL is how long the router remembers a session no run has used.
// It is longer than any session's idle timeout, after which the agent has
// closed the session anyway.
const SessionTTL = 25 * time.Hour

// Config configures a Router.
type Config struct {
	// Addresses of the agents, host:port.
	Addresses []string
	// PollInterval is how often each agent's status is read.
	PollInterval time.Duration
	// HTTPClient reaches the agents; it must speak h2c.
	HTTPClient *http.Client
	// ClientOptions are passed to every agent client.
	ClientOptions []connect.ClientOption
	Logger        *slog.Logger
}

// Router chooses agents.
type Router struct {
	agents []*Agent
	poll   time.Duration
	logger *slog.Logger

	mu       sync.Mutex
	sessions map[string]binding // session id -> agent holding it
	next     int                // rotates ties

	stop chan struct{}
	done chan struct{}
}

// New returns a router over the configured agents. It does not contact them
// until Start or Refresh.
func New(cfg Config) (*Router, error) {
	if len(cfg.Addresses) == 0 {
		return nil, errors.New("no agent addresses")
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Router{
		poll:     cfg.PollInterval,
		logger:   cfg.Logger,
		sessions: map[string]binding{},
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
		base := addr
		if !strings.Contains(base, "://") {
			base = "http://" + base
		}
		r.agents = append(r.agents, &Agent{
			Address: addr,
			Client:  agentv1connect.NewAgentServiceClient(cfg.HTTPClient, base, cfg.ClientOptions...),
		})
	}
	return r, nil
}

// Start polls the agents until Close: once now, synchronously, then every
// PollInterval in the background.
func (r *Router) Start(ctx context.Context) {
	r.Refresh(ctx)
	go func() {
		defer close(r.done)
		t := time.NewTicker(r.poll)
		defer t.Stop()
		for {
			select {
			case <-r.stop:
				return
			case now := <-t.C:
				r.Refresh(ctx)
				r.forget(now.Add(-SessionTTL))
			}
		}
	}()
}

// Close stops polling.
func (r *Router) Close() {
	close(r.stop)
	<-r.done
}

// Refresh reads every agent's status now, concurrently.
func (r *Router) Refresh(ctx context.Context) {
	var wg sync.WaitGroup
	for _, a := range r.agents {
		wg.Go(func() { r.refresh(ctx, a) })
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
		a.status = res.Msg.GetStatus()
		a.healthy = a.status.GetReady()
		a.lastErr = ""
		if !a.healthy {
			a.lastErr = "agent reports not ready"
		}
	}
	if was != a.healthy {
		r.logger.Info("agent health changed", "agent", a.Address, "healthy", a.healthy, "error", a.lastErr)
	}
}

// Agents returns a snapshot of every agent.
func (r *Router) Agents() []Snapshot {
	out := make([]Snapshot, 0, len(r.agents))
	for _, a := range r.agents {
		out = append(out, a.snapshot())
	}
	return out
}

// Pick returns the healthy agent matching labels with the most free
// capacity, skipping those in exclude. Among equals it rotates.
func (r *Router) Pick(labels map[string]string, exclude ...*Agent) (*Agent, error) {
	var best []*Agent
	bestScore := 0
	for _, a := range r.agents {
		if slices.Contains(exclude, a) || !a.Matches(labels) {
			continue
		}
		s, ok := a.score()
		if !ok {
			continue
		}
		switch {
		case len(best) == 0 || s > bestScore:
			best, bestScore = []*Agent{a}, s
		case s == bestScore:
			best = append(best, a)
		}
	}
	if len(best) == 0 {
		return nil, ErrNoAgent
	}
	r.mu.Lock()
	r.next++
	a := best[r.next%len(best)]
	r.mu.Unlock()
	return a, nil
}

// Session returns the agent that holds session id, if the router knows it
// and the session has not ended, and whether the agent has confirmed it.
func (r *Router) Session(id string) (a *Agent, confirmed, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.sessions[id]
	if !ok || b.gone != executionv1.SessionNotFound_REASON_UNSPECIFIED {
		return nil, false, false
	}
	return b.agent, b.confirmed, true
}

// Gone reports whether session id is known to have ended, why and when.
func (r *Router) Gone(id string) (reason executionv1.SessionNotFound_Reason, ended time.Time, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, found := r.sessions[id]
	if !found || b.gone == executionv1.SessionNotFound_REASON_UNSPECIFIED {
		return 0, time.Time{}, false
	}
	return b.gone, b.ended, true
}

// MarkGone records that session id ended for reason at ended, so that a
// later call for it is not_found with that reason rather than a new session.
func (r *Router) MarkGone(id string, reason executionv1.SessionNotFound_Reason, ended time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.sessions[id]
	if b.gone != executionv1.SessionNotFound_REASON_UNSPECIFIED {
		return
	}
	b.gone, b.ended, b.used = reason, ended, time.Now()
	r.sessions[id] = b
}

// forget drops sessions last used before cutoff.
func (r *Router) forget(cutoff time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, b := range r.sessions {
		if b.used.Before(cutoff) {
			delete(r.sessions, id)
		}
	}
}

// PickSession returns the agent holding session id, or picks one for the
// route and binds the session to it, atomically, so that concurrent first
// runs of a new session land on the same agent.
func (r *Router) PickSession(id string, labels map[string]string) (*Agent, error) {
	now := time.Now()
	r.mu.Lock()
	b, ok := r.sessions[id]
	if ok && b.gone == executionv1.SessionNotFound_REASON_UNSPECIFIED {
		b.used = now
		r.sessions[id] = b
	}
	r.mu.Unlock()
	if ok {
		if b.gone != executionv1.SessionNotFound_REASON_UNSPECIFIED {
			return nil, ErrSessionGone
		}
		return b.agent, nil
	}
	picked, err := r.Pick(labels)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if b, ok := r.sessions[id]; ok {
		if b.gone != executionv1.SessionNotFound_REASON_UNSPECIFIED {
			return nil, ErrSessionGone
		}
		return b.agent, nil
	}
	r.sessions[id] = binding{agent: picked, used: now}
	return picked, nil
}

// Bind records that agent a has confirmed it holds session id. A session
// known to have ended stays ended.
func (r *Router) Bind(id string, a *Agent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b, ok := r.sessions[id]; ok && b.gone != executionv1.SessionNotFound_REASON_UNSPECIFIED {
		return
	}
	r.sessions[id] = binding{agent: a, used: time.Now(), confirmed: true}
}

// All returns every agent, healthy or not.
func (r *Router) All() []*Agent { return slices.Clone(r.agents) }

// String describes the agent for logs.
func (a *Agent) String() string { return fmt.Sprintf("agent %s", a.Address) }
