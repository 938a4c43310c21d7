package redisstore

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/codemode-go/codemode/controlplane/internal/router"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/redistest"
	"github.com/codemode-go/codemode/internal/tlsconfig"
)

// testKey seals the records of the tests' stores, as one cluster secret
// would.
var testKey = []byte("0123456789abcdef0123456789abcdef:test")

// pair returns two stores on one real Redis, as two control planes have.
func pair(t *testing.T) (*Store, *Store, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	var out [2]*Store
	for i := range out {
		s, err := New(srv.URL, DefaultPrefix, testKey, nil, nil)
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
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: srv.Password})
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

// TestForgedAgentsAreNotRoutedTo writes agents' entries straight into
// Redis, as anything that can write to it could: one in the form of a
// record but without a MAC, one sealed under another key (another cluster
// secret), and a genuine one altered. None of them is routed to, each is
// logged once, and a genuine entry is routed to.
func TestForgedAgentsAreNotRoutedTo(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := t.Context()
	var logs bytes.Buffer
	var logMu sync.Mutex
	store, err := New(srv.URL, DefaultPrefix, testKey, slog.New(slog.NewTextHandler(lockedWriter{&logMu, &logs}, nil)), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	other, err := New(srv.URL, DefaultPrefix, []byte("another cluster's key, 32 bytes or more"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: srv.Password})
	t.Cleanup(func() { raw.Close() })

	now := time.Now()
	status := &agentv1.AgentStatus{Name: "a", Ready: true, Capacity: 4, Free: 4}
	const (
		genuine  = "127.0.0.1:30031"
		plain    = "127.0.0.1:30032"
		otherKey = "127.0.0.1:30033"
		altered  = "127.0.0.1:30034"
		moved    = "127.0.0.1:30035"
	)
	for _, addr := range []string{genuine, altered} {
		if err := store.Heartbeat(ctx, router.AgentRecord{Address: addr, Status: status, Interval: time.Minute, Seen: now}); err != nil {
			t.Fatal(err)
		}
	}
	// Without a MAC: the record as a control plane would seal it, bare.
	if err := raw.HSet(ctx, DefaultPrefix+"agents", plain, must(json.Marshal(map[string]any{"v": heartbeat{Status: must(proto.Marshal(status)), Interval: time.Minute, Seen: now}}))).Err(); err != nil {
		t.Fatal(err)
	}
	if err := other.Heartbeat(ctx, router.AgentRecord{Address: otherKey, Status: status, Interval: time.Minute, Seen: now}); err != nil {
		t.Fatal(err)
	}
	// The genuine entry of one agent, its capacity raised; and copied
	// under another address.
	entry := raw.HGet(ctx, DefaultPrefix+"agents", altered).Val()
	if !strings.Contains(entry, `"interval":60000000000`) {
		t.Fatalf("entry %s: not the form this test alters", entry)
	}
	if err := raw.HSet(ctx, DefaultPrefix+"agents", altered, strings.Replace(entry, `"interval":60000000000`, `"interval":600000000000`, 1)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := raw.HSet(ctx, DefaultPrefix+"agents", moved, raw.HGet(ctx, DefaultPrefix+"agents", genuine).Val()).Err(); err != nil {
		t.Fatal(err)
	}

	routesOnlyGenuine(t, ctx, store, genuine, []string{plain, otherKey, altered, moved}, &logMu, &logs)
}

// routesOnlyGenuine checks that a router on store knows and picks only the
// genuine agent, and that each forged entry is logged once, without a key or a record.
func routesOnlyGenuine(t *testing.T, ctx context.Context, store *Store, genuine string, forged []string, logMu *sync.Mutex, logs *bytes.Buffer) {
	r, err := router.New(router.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		r.Sync(ctx)
	}
	var known []string
	for _, a := range r.Agents() {
		known = append(known, a.Address)
	}
	if len(known) != 1 || known[0] != genuine {
		t.Fatalf("the router knows agents %v, want only the genuine %s", known, genuine)
	}
	for range 10 {
		if a, err := r.Pick(nil); err != nil || a.Address != genuine {
			t.Fatalf("Pick: %v %v, want %s", a, err, genuine)
		}
	}
	logMu.Lock()
	out := logs.String()
	logMu.Unlock()
	for _, addr := range forged {
		if n := strings.Count(out, "agent="+addr); n != 1 {
			t.Errorf("the entry of %s is logged %d times, want once:\n%s", addr, n, out)
		}
	}
	if strings.Contains(out, "level=WARN") && strings.Contains(out, genuine) {
		t.Errorf("the genuine entry is reported:\n%s", out)
	}
	if strings.Contains(out, string(testKey)) || strings.Contains(out, `"mac"`) {
		t.Errorf("the log holds a key or a record:\n%s", out)
	}
}

// TestForgedSessionsAreNotRoutedTo writes sessions' records straight into
// Redis: one without a MAC, a genuine one altered to name another agent, a
// genuine one copied to another session, and a tombstone without a MAC.
// None is routed to: each reads as no record, and the next write replaces
// it; a genuine binding is routed to.
func TestForgedSessionsAreNotRoutedTo(t *testing.T) {
	t.Parallel()
	a, b, srv := pair(t)
	ctx := t.Context()
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: srv.Password})
	t.Cleanup(func() { raw.Close() })
	const (
		agent = "127.0.0.1:30031"
		evil  = "127.0.0.1:30666"
	)
	key := func(id string) string { return DefaultPrefix + "session:" + id }

	if _, err := a.BindNew(ctx, "genuine", router.Binding{Agent: agent, Tenant: "t1"}); err != nil {
		t.Fatal(err)
	}
	if got, ok, err := b.Session(ctx, "genuine"); err != nil || !ok || got.Agent != agent {
		t.Fatalf("the genuine binding reads %+v %v %v", got, ok, err)
	}
	sealedBinding := raw.Get(ctx, key("genuine")).Val()
	forged := map[string]string{
		"plain":     string(must(json.Marshal(router.Binding{Agent: evil, Tenant: "t1", Confirmed: true}))),
		"unsealed":  string(must(json.Marshal(map[string]any{"v": router.Binding{Agent: evil, Tenant: "t1", Confirmed: true}}))),
		"altered":   strings.Replace(sealedBinding, agent, evil, 1),
		"moved":     sealedBinding,
		"tombstone": string(must(json.Marshal(map[string]any{"v": router.Binding{Gone: executionv1.SessionNotFound_REASON_CLOSED, Ended: time.Now()}, "mac": "AAAA"}))),
	}
	for id, v := range forged {
		if err := raw.Set(ctx, key(id), v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for id := range forged {
		if got, ok, err := b.Session(ctx, id); err != nil || ok {
			t.Errorf("session %s: forged record reads %+v %v %v, want none", id, got, ok, err)
		}
	}
	r, err := router.New(router.Config{Store: b})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(ctx, agent, &agentv1.AgentStatus{Ready: true, Capacity: 4, Free: 4}, time.Minute); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"plain", "unsealed", "altered"} {
		got, bound, err := r.PickSession(ctx, id, "t1", nil)
		if err != nil || got.Address != agent || bound.Agent != agent || bound.Confirmed {
			t.Errorf("PickSession %s: %v %+v %v, want a new binding to %s", id, got, bound, err, agent)
		}
		if held, ok, err := a.Session(ctx, id); err != nil || !ok || held.Agent != agent {
			t.Errorf("session %s after PickSession: %+v %v %v, want bound to %s", id, held, ok, err, agent)
		}
	}
	// A confirmation and an end replace what fails its check, tombstones
	// included; a genuine tombstone stays (TestTombstoneIsNotOverwritten).
	if err := a.Confirm(ctx, "tombstone", router.Binding{Agent: agent, Tenant: "t1"}); err != nil {
		t.Fatal(err)
	}
	if held, ok, err := b.Session(ctx, "tombstone"); err != nil || !ok || !held.Confirmed || held.Agent != agent {
		t.Errorf("after Confirm over a forged tombstone: %+v %v %v, want confirmed on %s", held, ok, err, agent)
	}
	if err := a.End(ctx, "moved", executionv1.SessionNotFound_REASON_CLOSED, time.Now()); err != nil {
		t.Fatal(err)
	}
	if held, ok, err := b.Session(ctx, "moved"); err != nil || !ok || held.Gone != executionv1.SessionNotFound_REASON_CLOSED {
		t.Errorf("after End over a moved record: %+v %v %v, want closed", held, ok, err)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestUnreachableRedisIsUnavailable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	s, err := New("redis://"+addr+"/0", DefaultPrefix, testKey, nil, nil)
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
	s, err := New(srv.URL, DefaultPrefix, testKey, nil, nil)
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

// Over rediss:// to Redis's own TLS, with a password, the store keeps and
// reads records trusting the cluster's CA; a client that does not trust it,
// or that speaks plain TCP to the TLS port, gets nothing.
func TestRedisOverTLS(t *testing.T) {
	t.Parallel()
	ca, err := tlsconfig.NewCA("redis test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := ca.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	is, err := ca.Issue([]string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := is.WriteFiles(dir, "redis")
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	srv := redistest.StartTLS(t, redistest.TLS{CertFile: cert, KeyFile: key, CAFile: caFile})
	if !strings.HasPrefix(srv.URL, "rediss://") {
		t.Fatalf("URL %s, want rediss://", srv.URL)
	}
	pool, err := tlsconfig.LoadCAPool(caFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	roots := pool.ClientConfig
	s, err := New(srv.URL, DefaultPrefix, testKey, nil, roots)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("ping over TLS: %v", err)
	}
	r, err := router.New(router.Config{Store: s})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(t.Context(), "127.0.0.1:30031", &agentv1.AgentStatus{Ready: true}, time.Minute); err != nil {
		t.Fatalf("register over TLS: %v", err)
	}
	for _, tc := range []struct {
		name, url string
		roots     func(string) *tls.Config
	}{
		{"without the CA", srv.URL, nil},
		{"plain TCP to the TLS port", strings.Replace(srv.URL, "rediss://", "redis://", 1), roots},
		{"without the password", "rediss://" + srv.Addr + "/0", roots},
	} {
		other, err := New(tc.url, DefaultPrefix, testKey, nil, tc.roots)
		if err != nil {
			t.Fatal(err)
		}
		if err := other.Ping(t.Context()); err == nil {
			t.Errorf("%s: ping succeeded", tc.name)
		}
		other.Close()
	}
}

// The store trusts the CA file as it is at each new connection: after the
// Redis moves to a certificate of a new CA and the file to that CA, the
// store, not made again, connects; a store that read the file once cannot.
func TestRedisCAReloaded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	oldCA, cert, key := issueRedisCert(t, dir, "old")
	replaceCAFile(t, caFile, oldCA)
	srv := redistest.StartTLS(t, redistest.TLS{CertFile: cert, KeyFile: key, CAFile: caFile})
	pool, err := tlsconfig.LoadCAPool(caFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	fixed, err := tlsconfig.Client(caFile)
	if err != nil {
		t.Fatal(err)
	}
	reloading, err := New(srv.URL, DefaultPrefix, testKey, nil, pool.ClientConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer reloading.Close()
	once, err := New(srv.URL, DefaultPrefix, testKey, nil, func(name string) *tls.Config {
		c := fixed.Clone()
		c.ServerName = name
		return c
	})
	if err != nil {
		t.Fatal(err)
	}
	defer once.Close()
	for _, s := range []*Store{reloading, once} {
		if err := s.Ping(t.Context()); err != nil {
			t.Fatalf("ping before the rotation: %v", err)
		}
	}

	// Redis moves to the new CA's certificate (CONFIG SET reloads its TLS),
	// the file to the new CA, and every client connection is dropped.
	newCA, cert, key := issueRedisCert(t, dir, "new")
	if err := reloading.c.Do(t.Context(), "CONFIG", "SET", "tls-cert-file", cert, "tls-key-file", key).Err(); err != nil {
		t.Fatalf("move Redis to the new certificate: %v", err)
	}
	replaceCAFile(t, caFile, newCA)
	if err := reloading.c.Do(t.Context(), "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "no").Err(); err != nil && !strings.Contains(err.Error(), "EOF") {
		t.Logf("client kill: %v", err)
	}
	testkit.Eventually(t, 10*time.Second, func() error { return reloading.Ping(t.Context()) })
	if err := once.Ping(t.Context()); err == nil {
		t.Fatal("a store that read the CA file once connected to the new CA's Redis")
	}
}

// issueRedisCert makes a CA named after name, and writes into dir a
// certificate of it for 127.0.0.1, and its key, as Redis's.
func issueRedisCert(t *testing.T, dir, name string) (ca *tlsconfig.CA, cert, key string) {
	t.Helper()
	ca, err := tlsconfig.NewCA("redis test CA "+name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	is, err := ca.Issue([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if cert, key, err = is.WriteFiles(dir, "redis-"+name); err != nil {
		t.Fatal(err)
	}
	return ca, cert, key
}

// replaceCAFile puts ca's certificate in caFile, written beside and
// renamed, as a secret manager does.
func replaceCAFile(t *testing.T, caFile string, ca *tlsconfig.CA) {
	t.Helper()
	sub := t.TempDir()
	if err := ca.WriteFiles(sub); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(sub, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caFile+".new", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(caFile+".new", caFile); err != nil {
		t.Fatal(err)
	}
}
