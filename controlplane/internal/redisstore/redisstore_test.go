package redisstore

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/codemode-go/codemode/controlplane/internal/router"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/redistest"
)

// pair returns two stores on one real Redis, as two control planes have.
func pair(t *testing.T) (*Store, *Store, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	var out [2]*Store
	for i := range out {
		s, err := New(srv.URL, DefaultPrefix)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if err := s.Ping(t.Context()); err != nil {
			t.Fatal(err)
		}
		out[i] = s
	}
	return out[0], out[1], srv
}

func TestBindNewIsAtomicAcrossStores(t *testing.T) {
	t.Parallel()
	a, b, _ := pair(t)
	ctx := t.Context()
	for i := range 20 {
		id := fmt.Sprintf("s%d", i)
		var wg sync.WaitGroup
		got := make([]router.Binding, 8)
		errs := make([]error, 8)
		for w := range 8 {
			s := a
			if w%2 == 1 {
				s = b
			}
			wg.Go(func() {
				got[w], errs[w] = s.BindNew(ctx, id, router.Binding{Agent: fmt.Sprintf("127.0.0.1:%d", 30000+w), Tenant: "t1"})
			})
		}
		wg.Wait()
		for w := range got {
			if errs[w] != nil {
				t.Fatal(errs[w])
			}
			if got[w] != got[0] {
				t.Fatalf("session %s: worker %d bound to %+v, worker 0 to %+v", id, w, got[w], got[0])
			}
		}
		if held, ok, err := b.Session(ctx, id); err != nil || !ok || held != got[0] {
			t.Fatalf("session %s reads %+v %v %v, want %+v", id, held, ok, err, got[0])
		}
	}
}

func TestTombstoneIsNotOverwritten(t *testing.T) {
	t.Parallel()
	a, b, _ := pair(t)
	ctx := t.Context()
	bound := router.Binding{Agent: "127.0.0.1:30031", Tenant: "t1"}
	if _, err := a.BindNew(ctx, "s1", bound); err != nil {
		t.Fatal(err)
	}
	if err := b.Confirm(ctx, "s1", bound); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := a.Session(ctx, "s1"); !got.Confirmed || got.Agent != bound.Agent || got.Tenant != "t1" {
		t.Fatalf("confirmed through the other store: %+v", got)
	}
	ended := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	if err := a.End(ctx, "s1", executionv1.SessionNotFound_REASON_CLOSED, ended); err != nil {
		t.Fatal(err)
	}
	// Neither a confirmation, nor a new binding, nor a second end changes it.
	if err := b.Confirm(ctx, "s1", bound); err != nil {
		t.Fatal(err)
	}
	if got, err := b.BindNew(ctx, "s1", bound); err != nil || got.Gone != executionv1.SessionNotFound_REASON_CLOSED {
		t.Fatalf("BindNew of a closed session: %+v %v, want the tombstone", got, err)
	}
	if err := b.End(ctx, "s1", executionv1.SessionNotFound_REASON_LOST, time.Now()); err != nil {
		t.Fatal(err)
	}
	got, ok, err := b.Session(ctx, "s1")
	if err != nil || !ok || got.Gone != executionv1.SessionNotFound_REASON_CLOSED || !got.Ended.Equal(ended) {
		t.Fatalf("tombstone %+v %v %v, want closed at %v", got, ok, err, ended)
	}
	// A session never seen can be ended, so that its id is not reborn.
	if err := a.End(ctx, "s2", executionv1.SessionNotFound_REASON_EXPIRED, ended); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.BindNew(ctx, "s2", bound); got.Gone != executionv1.SessionNotFound_REASON_EXPIRED {
		t.Fatalf("BindNew of an expired session: %+v", got)
	}
}

func TestSessionKeysExpire(t *testing.T) {
	t.Parallel()
	a, _, srv := pair(t)
	ctx := t.Context()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	check := func(what string) {
		t.Helper()
		ttl, err := c.TTL(ctx, DefaultPrefix+"session:s1").Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl <= router.SessionTTL-time.Minute || ttl > router.SessionTTL {
			t.Fatalf("after %s the TTL is %v, want about %v", what, ttl, router.SessionTTL)
		}
	}
	if _, err := a.BindNew(ctx, "s1", router.Binding{Agent: "127.0.0.1:30031"}); err != nil {
		t.Fatal(err)
	}
	check("BindNew")
	if err := c.Expire(ctx, DefaultPrefix+"session:s1", time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Session(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	check("a read")
	if err := a.Confirm(ctx, "s1", router.Binding{Agent: "127.0.0.1:30031"}); err != nil {
		t.Fatal(err)
	}
	check("Confirm")
	if err := a.End(ctx, "s1", executionv1.SessionNotFound_REASON_CLOSED, time.Now()); err != nil {
		t.Fatal(err)
	}
	check("End")
}

func TestAgentsAreSharedAndForgotten(t *testing.T) {
	t.Parallel()
	a, b, _ := pair(t)
	ctx := t.Context()
	now := time.Now().Truncate(time.Millisecond)
	status := &agentv1.AgentStatus{Name: "a1", Ready: true, Capacity: 4, Free: 3}
	if err := a.Heartbeat(ctx, router.AgentRecord{Address: "127.0.0.1:30031", Status: status, Interval: 500 * time.Millisecond, Seen: now}); err != nil {
		t.Fatal(err)
	}
	if err := a.Heartbeat(ctx, router.AgentRecord{Address: "127.0.0.1:30032", Status: status, Interval: time.Second, Seen: now.Add(-router.ForgetAgentAfter - time.Second)}); err != nil {
		t.Fatal(err)
	}
	recs, err := b.Agents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Address != "127.0.0.1:30031" || recs[0].Status.GetName() != "a1" || recs[0].Status.GetFree() != 3 ||
		recs[0].Interval != 500*time.Millisecond || !recs[0].Seen.Equal(now) {
		t.Fatalf("agents seen from the other store: %+v", recs)
	}
	if n, err := a.c.HLen(ctx, a.agentsKey()).Result(); err != nil || n != 1 {
		t.Fatalf("%d agents kept (%v), want the silent one forgotten", n, err)
	}
}

// TestRoutersShareSessionsAndAgents: two routers on one Redis, as two
// control planes: concurrent first runs of a session land on one agent
// whichever router takes them, and an agent heard by one is routed to by
// the other.
func TestRoutersShareSessionsAndAgents(t *testing.T) {
	t.Parallel()
	sa, sb, _ := pair(t)
	ctx := t.Context()
	ra, err := router.New(router.Config{Store: sa})
	if err != nil {
		t.Fatal(err)
	}
	rb, err := router.New(router.Config{Store: sb})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range []*router.Router{ra, rb} {
		// Each router hears from its own agent; the other learns it from Redis.
		addr := fmt.Sprintf("127.0.0.1:%d", 30031+i)
		if err := r.Register(ctx, addr, &agentv1.AgentStatus{Ready: true, Capacity: 2, Free: 2}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	ra.Sync(ctx)
	rb.Sync(ctx)
	for _, r := range []*router.Router{ra, rb} {
		if n := len(r.Agents()); n != 2 {
			t.Fatalf("a router knows %d agents, want 2", n)
		}
	}
	for i := range 10 {
		id := fmt.Sprintf("s%d", i)
		var wg sync.WaitGroup
		got := make([]string, 6)
		for w := range got {
			r := ra
			if w%2 == 1 {
				r = rb
			}
			wg.Go(func() {
				a, _, err := r.PickSession(ctx, id, "t1", nil)
				if err != nil {
					t.Error(err)
					return
				}
				got[w] = a.Address
			})
		}
		wg.Wait()
		for w := range got {
			if got[w] != got[0] {
				t.Fatalf("session %s: first runs landed on %v", id, got)
			}
		}
	}
	// A session ended through one router is ended through the other.
	if err := ra.MarkGone(ctx, "s0", executionv1.SessionNotFound_REASON_CLOSED, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, b, err := rb.PickSession(ctx, "s0", "t1", nil); !errors.Is(err, router.ErrSessionGone) || b.Gone != executionv1.SessionNotFound_REASON_CLOSED {
		t.Fatalf("PickSession of a session closed elsewhere: %v %+v", err, b)
	}
}

func TestUnreachableRedisIsUnavailable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	s, err := New("redis://"+addr+"/0", DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := router.New(router.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := r.Session(t.Context(), "s1"); !errors.Is(err, router.ErrStoreUnavailable) {
		t.Fatalf("Session: %v, want ErrStoreUnavailable", err)
	}
	if err := r.Register(t.Context(), "127.0.0.1:30031", &agentv1.AgentStatus{Ready: true}, time.Second); !errors.Is(err, router.ErrStoreUnavailable) {
		t.Fatalf("Register: %v, want ErrStoreUnavailable", err)
	}
}

// BenchmarkSession is the store's part of a run in a known session: one
// GETEX on a loopback Redis, decoded.
func BenchmarkSession(b *testing.B) {
	srv := redistest.Start(b)
	s, err := New(srv.URL, DefaultPrefix)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := b.Context()
	if _, err := s.BindNew(ctx, "s1", router.Binding{Agent: "127.0.0.1:30031", Tenant: "t1", Confirmed: true}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok, err := s.Session(ctx, "s1"); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}
