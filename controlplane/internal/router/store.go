package router

import (
	"context"
	"errors"
	"sync"
	"time"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// Store keeps what every replica of the control plane must agree on: which
// agent holds each session (a binding), the sessions that ended (a
// tombstone, so that an id is never reborn), and the agents that joined by
// heartbeat. Memory (the default) serves one control plane; a shared store
// (Redis) lets any replica route any session.
//
// # Errors
//
// A store that cannot answer returns an error wrapping ErrStoreUnavailable;
// the router passes it on rather than guess, so a session is never routed
// to an agent that may not hold it.
type Store interface {
	// Session returns session id's binding, and false when there is none.
	// Reading it counts as using it: the binding lives SessionTTL from now.
	Session(ctx context.Context, id string) (Binding, bool, error)
	// BindNew binds id to b unless id has a binding or a tombstone already,
	// atomically, and returns the binding that holds afterwards: b, or the
	// one there was.
	BindNew(ctx context.Context, id string, b Binding) (Binding, error)
	// Confirm records b, confirmed, unless id has a tombstone.
	Confirm(ctx context.Context, id string, b Binding) error
	// End makes id a tombstone with reason and ended, unless it is one.
	End(ctx context.Context, id string, reason executionv1.SessionNotFound_Reason, ended time.Time) error
	// Heartbeat records an agent's heartbeat for the other replicas.
	Heartbeat(ctx context.Context, rec AgentRecord) error
	// Agents returns the agents other replicas heard from, at most
	// ForgetAgentAfter ago.
	Agents(ctx context.Context) ([]AgentRecord, error)
	// Sweep drops bindings unused since before cutoff, and agents not heard
	// from in ForgetAgentAfter, where the store does not expire them itself.
	Sweep(ctx context.Context, cutoff time.Time) error
}

// ErrStoreUnavailable wraps a shared store's failures.
var ErrStoreUnavailable = errors.New("the session store is unavailable")

// Binding is what a store keeps of a session.
type Binding struct {
	// Agent is the address of the agent holding the session.
	Agent string `json:"agent,omitempty"`
	// Tenant owns the session.
	Tenant string `json:"tenant,omitempty"`
	// Confirmed: the agent has said it holds the session (a run, a file
	// call or the creation succeeded). A confirmed session that the agent
	// no longer knows was lost with it.
	Confirmed bool `json:"confirmed,omitempty"`
	// Gone, when set, says why the session ended: the binding is a
	// tombstone.
	Gone executionv1.SessionNotFound_Reason `json:"gone,omitempty"`
	// Ended is when it ended.
	Ended time.Time `json:"ended,omitzero"`
}

// ended reports whether b is a tombstone.
func (b Binding) ended() bool { return b.Gone != executionv1.SessionNotFound_REASON_UNSPECIFIED }

// AgentRecord is an agent's last heartbeat as a store shares it.
type AgentRecord struct {
	Address  string
	Status   *agentv1.AgentStatus
	Interval time.Duration
	// Seen is when the heartbeat came.
	Seen time.Time
}

// Memory is the Store of one control plane: bindings in a map, forgotten
// SessionTTL after their last use. The router's own list of agents is the
// registry, so Heartbeat and Agents do nothing. Safe for concurrent use.
type Memory struct {
	mu       sync.Mutex
	sessions map[string]memoryBinding
}

type memoryBinding struct {
	Binding
	used time.Time
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty Memory.
func NewMemory() *Memory { return &Memory{sessions: map[string]memoryBinding{}} }

// Session implements Store.
func (m *Memory) Session(_ context.Context, id string) (Binding, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.sessions[id]
	if ok && !b.ended() {
		b.used = time.Now()
		m.sessions[id] = b
	}
	return b.Binding, ok, nil
}

// BindNew implements Store.
func (m *Memory) BindNew(_ context.Context, id string, b Binding) (Binding, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if had, ok := m.sessions[id]; ok {
		return had.Binding, nil
	}
	m.sessions[id] = memoryBinding{Binding: b, used: time.Now()}
	return b, nil
}

// Confirm implements Store.
func (m *Memory) Confirm(_ context.Context, id string, b Binding) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if had, ok := m.sessions[id]; ok && had.ended() {
		return nil
	}
	b.Confirmed, b.Gone, b.Ended = true, 0, time.Time{}
	m.sessions[id] = memoryBinding{Binding: b, used: time.Now()}
	return nil
}

// End implements Store.
func (m *Memory) End(_ context.Context, id string, reason executionv1.SessionNotFound_Reason, ended time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.sessions[id]
	if b.ended() {
		return nil
	}
	b.Gone, b.Ended, b.used = reason, ended, time.Now()
	m.sessions[id] = b
	return nil
}

// Heartbeat implements Store: the router already knows.
func (m *Memory) Heartbeat(context.Context, AgentRecord) error { return nil }

// Agents implements Store: no other replica shares this memory.
func (m *Memory) Agents(context.Context) ([]AgentRecord, error) { return nil, nil }

// Sweep implements Store.
func (m *Memory) Sweep(_ context.Context, cutoff time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, b := range m.sessions {
		if b.used.Before(cutoff) {
			delete(m.sessions, id)
		}
	}
	return nil
}
