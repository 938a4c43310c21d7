package router

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
)

// clock is a settable clock for heartbeats' expiry.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestRegisteredAgentsJoinLeaveAndRejoin(t *testing.T) {
	t.Parallel()
	c := &clock{t: time.Unix(1_000_000, 0)}
	r, err := New(Config{Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Pick(nil); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("no agent yet: got %v, want ErrNoAgent", err)
	}
	const interval = 500 * time.Millisecond
	status := func(name string, free int32) *agentv1.AgentStatus {
		return &agentv1.AgentStatus{Name: name, Ready: true, Free: free, Capacity: 4}
	}
	membership := func(want Membership) {
		t.Helper()
		if got := r.Membership(); got != want {
			t.Fatalf("membership %+v, want %+v", got, want)
		}
	}
	r.Register(t.Context(), "127.0.0.11:30031", status("a", 4), interval)
	r.Register(t.Context(), "127.0.0.12:30031", status("b", 2), interval)
	if a, err := r.Pick(nil); err != nil || a.Address != "127.0.0.11:30031" {
		t.Fatalf("picked %v, %v; want the agent with more free", a, err)
	}
	membership(Membership{Registered: 2, Joined: 2})
	snaps := r.Agents()
	if len(snaps) != 2 || !snaps[0].Registered || !snaps[0].Healthy {
		t.Fatalf("agents %+v, want two registered, healthy", snaps)
	}

	// b keeps beating; a stops.
	for range MissedHeartbeats {
		c.advance(interval)
		r.Register(t.Context(), "127.0.0.12:30031", status("b", 2), interval)
	}
	if a, err := r.Pick(nil); err != nil || a.Address != "127.0.0.12:30031" {
		t.Fatalf("after a missed %d heartbeats picked %v, %v; want b", MissedHeartbeats, a, err)
	}
	for _, s := range r.Agents() {
		if s.Address == "127.0.0.11:30031" && (s.Healthy || s.Error == "") {
			t.Fatalf("silent agent listed as %+v, want unhealthy with a reason", s)
		}
	}
	membership(Membership{Registered: 2, Joined: 2, Left: 1})

	// a comes back with the same address: the same agent, so that
	// sessions bound to it find it again.
	before := r.All()[0]
	r.Register(t.Context(), "127.0.0.11:30031", status("a", 4), interval)
	if a, err := r.Pick(nil); err != nil || a != before {
		t.Fatalf("after rejoining picked %v, %v; want a again", a, err)
	}
	membership(Membership{Registered: 2, Joined: 3, Left: 1})

	// A registered agent that reports not ready is not picked.
	r.Register(t.Context(), "127.0.0.11:30031", &agentv1.AgentStatus{Name: "a", Free: 4}, interval)
	if a, _ := r.Pick(nil); a.Address != "127.0.0.12:30031" {
		t.Fatalf("picked %v, want b while a is not ready", a)
	}
	membership(Membership{Registered: 2, Joined: 3, Left: 2})

	// Silent long enough, an agent is forgotten.
	c.advance(ForgetAgentAfter + time.Second)
	r.Register(t.Context(), "127.0.0.12:30031", status("b", 2), interval)
	r.forgetAgents(c.now().Add(-ForgetAgentAfter))
	if got := r.All(); len(got) != 1 || got[0].Address != "127.0.0.12:30031" {
		t.Fatalf("agents %v, want only b", got)
	}
	membership(Membership{Registered: 2, Joined: 3, Left: 2})
	r.Register(t.Context(), "127.0.0.11:30031", status("a", 4), interval)
	membership(Membership{Registered: 3, Joined: 4, Left: 2})
}

// resolver answers from a table that the test changes.
type resolver struct {
	mu    sync.Mutex
	hosts map[string][]string
	err   error
}

func (f *resolver) set(host string, addrs []string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hosts[host], f.err = addrs, err
}

func (f *resolver) LookupHost(_ context.Context, host string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	return f.hosts[host], nil
}

func addresses(r *Router) []string {
	var out []string
	for _, a := range r.All() {
		out = append(out, a.Address)
	}
	slices.Sort(out)
	return out
}

func TestNamesAreResolvedAgain(t *testing.T) {
	t.Parallel()
	res := &resolver{hosts: map[string][]string{}}
	res.set("agents.example", []string{"127.0.0.11", "127.0.0.12"}, nil)
	r, err := New(Config{Addresses: []string{"agents.example:30031", "127.0.0.19:30031"}, Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	r.Resolve(t.Context())
	want := []string{"127.0.0.11:30031", "127.0.0.12:30031", "127.0.0.19:30031"}
	if got := addresses(r); !slices.Equal(got, want) {
		t.Fatalf("agents %v, want %v", got, want)
	}
	kept := r.byAddr["127.0.0.12:30031"]

	// The name now gives one old address and one new.
	res.set("agents.example", []string{"127.0.0.12", "::1"}, nil)
	r.Resolve(t.Context())
	want = []string{"127.0.0.12:30031", "127.0.0.19:30031", "[::1]:30031"}
	if got := addresses(r); !slices.Equal(got, want) {
		t.Fatalf("after a change agents %v, want %v", got, want)
	}
	if r.byAddr["127.0.0.12:30031"] != kept {
		t.Fatal("an address resolved again became a new agent")
	}

	// A failed resolution keeps what there was.
	res.set("agents.example", nil, errors.New("server misbehaving"))
	r.Resolve(t.Context())
	if got := addresses(r); !slices.Equal(got, want) {
		t.Fatalf("after a failed resolution agents %v, want %v", got, want)
	}
}

func TestLocalhostResolvesWithoutDNS(t *testing.T) {
	t.Parallel()
	r, err := New(Config{Addresses: []string{"localhost:30031"}})
	if err != nil {
		t.Fatal(err)
	}
	r.Resolve(t.Context())
	got := addresses(r)
	if !slices.Contains(got, "127.0.0.1:30031") && !slices.Contains(got, "[::1]:30031") {
		t.Fatalf("localhost resolved to %v, want a loopback address", got)
	}
}

func TestBadAddressIsRefused(t *testing.T) {
	t.Parallel()
	if _, err := New(Config{Addresses: []string{"no-port"}}); err == nil {
		t.Fatal("an address without a port was accepted")
	}
}
