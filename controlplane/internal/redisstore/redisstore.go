// Package redisstore keeps the control plane's shared state in Redis, so
// that several control planes route the same sessions and know the same
// agents: each session's binding (agent address, tenant, confirmed) or
// tombstone (why and when it ended), and each agent's last heartbeat.
//
// Keys, under a prefix (DefaultPrefix):
//
//	<prefix>session:<id>  string, JSON of router.Binding; expires
//	                      router.SessionTTL after its last read or write
//	<prefix>agents        hash, agent address -> JSON of its last heartbeat
//	                      (status, interval, when); entries older than
//	                      router.ForgetAgentAfter are deleted when read
//
// A new binding is written with SET NX GET (one round trip: the first
// replica's choice wins and the others read it back), and confirming a
// binding or ending a session runs a script that leaves a tombstone alone,
// so a closed session is never bound again.
//
// # Errors
//
// Every failure, Redis's or a record that does not decode, wraps
// router.ErrStoreUnavailable.
package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"

	"github.com/codemode-go/codemode/controlplane/internal/router"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// DefaultPrefix starts every key.
const DefaultPrefix = "codemode:"

// Timeout bounds each Redis call (dial, read, write) when the caller's
// context allows longer: a store that does not answer is unavailable, fast.
const Timeout = time.Second

// Store is a router.Store in Redis. Safe for concurrent use.
type Store struct {
	c      *redis.Client
	prefix string
	now    func() time.Time
}

var _ router.Store = (*Store)(nil)

// New returns a Store on the Redis at url (redis://[user:password@]host:port[/db],
// or rediss:// for TLS) whose keys start with prefix. It does not connect
// until first used; Ping checks the server.
func New(url, prefix string) (*Store, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = Timeout, Timeout, Timeout
	opts.ContextTimeoutEnabled = true
	opts.MaxRetries = 1
	return &Store{c: redis.NewClient(opts), prefix: prefix, now: time.Now}, nil
}

// Ping checks that the server answers.
func (s *Store) Ping(ctx context.Context) error {
	return unavailable("ping", s.c.Ping(ctx).Err())
}

// Close closes the connections.
func (s *Store) Close() error { return s.c.Close() }

func unavailable(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: redis %s: %w", router.ErrStoreUnavailable, what, err)
}

func (s *Store) sessionKey(id string) string { return s.prefix + "session:" + id }
func (s *Store) agentsKey() string           { return s.prefix + "agents" }

// Session implements router.Store: GETEX, one round trip.
func (s *Store) Session(ctx context.Context, id string) (router.Binding, bool, error) {
	v, err := s.c.GetEx(ctx, s.sessionKey(id), router.SessionTTL).Bytes()
	if errors.Is(err, redis.Nil) {
		return router.Binding{}, false, nil
	}
	if err != nil {
		return router.Binding{}, false, unavailable("read session", err)
	}
	var b router.Binding
	if err := json.Unmarshal(v, &b); err != nil {
		return router.Binding{}, false, unavailable("decode session", err)
	}
	return b, true, nil
}

// BindNew implements router.Store: SET NX GET, one round trip.
func (s *Store) BindNew(ctx context.Context, id string, b router.Binding) (router.Binding, error) {
	v, err := json.Marshal(b)
	if err != nil {
		return router.Binding{}, err
	}
	old, err := s.c.SetArgs(ctx, s.sessionKey(id), v, redis.SetArgs{Mode: "NX", Get: true, TTL: router.SessionTTL}).Result()
	if errors.Is(err, redis.Nil) {
		return b, nil // set: there was nothing
	}
	if err != nil {
		return router.Binding{}, unavailable("bind session", err)
	}
	var had router.Binding
	if err := json.Unmarshal([]byte(old), &had); err != nil {
		return router.Binding{}, unavailable("decode session", err)
	}
	return had, nil
}

// setUnlessEnded sets KEYS[1] to ARGV[1] for ARGV[2] milliseconds unless it
// holds a tombstone; 1 if it set it.
var setUnlessEnded = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and cjson.decode(v)['gone'] ~= nil then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
`)

func (s *Store) setUnlessEnded(ctx context.Context, id string, b router.Binding) error {
	v, err := json.Marshal(b)
	if err != nil {
		return err
	}
	err = setUnlessEnded.Run(ctx, s.c, []string{s.sessionKey(id)}, v, router.SessionTTL.Milliseconds()).Err()
	return unavailable("write session", err)
}

// Confirm implements router.Store: one script, one round trip.
func (s *Store) Confirm(ctx context.Context, id string, b router.Binding) error {
	b.Confirmed, b.Gone, b.Ended = true, 0, time.Time{}
	return s.setUnlessEnded(ctx, id, b)
}

// End implements router.Store: one script, one round trip.
func (s *Store) End(ctx context.Context, id string, reason executionv1.SessionNotFound_Reason, ended time.Time) error {
	if reason == executionv1.SessionNotFound_REASON_UNSPECIFIED {
		return errors.New("end a session: no reason")
	}
	return s.setUnlessEnded(ctx, id, router.Binding{Gone: reason, Ended: ended})
}

// heartbeat is an agent's entry in the agents hash.
type heartbeat struct {
	Status   []byte        `json:"status"` // agentv1.AgentStatus, binary
	Interval time.Duration `json:"interval"`
	Seen     time.Time     `json:"seen"`
}

// Heartbeat implements router.Store: HSET, one round trip.
func (s *Store) Heartbeat(ctx context.Context, rec router.AgentRecord) error {
	status, err := proto.Marshal(rec.Status)
	if err != nil {
		return err
	}
	v, err := json.Marshal(heartbeat{Status: status, Interval: rec.Interval, Seen: rec.Seen})
	if err != nil {
		return err
	}
	return unavailable("record heartbeat", s.c.HSet(ctx, s.agentsKey(), rec.Address, v).Err())
}

// Agents implements router.Store: HGETALL, and HDEL of the agents not
// heard from in router.ForgetAgentAfter.
func (s *Store) Agents(ctx context.Context) ([]router.AgentRecord, error) {
	all, err := s.c.HGetAll(ctx, s.agentsKey()).Result()
	if err != nil {
		return nil, unavailable("read agents", err)
	}
	cutoff := s.now().Add(-router.ForgetAgentAfter)
	var out []router.AgentRecord
	var stale []string
	for addr, v := range all {
		var hb heartbeat
		status := &agentv1.AgentStatus{}
		if err := json.Unmarshal([]byte(v), &hb); err != nil {
			return nil, unavailable("decode agent "+addr, err)
		}
		if err := proto.Unmarshal(hb.Status, status); err != nil {
			return nil, unavailable("decode agent "+addr, err)
		}
		if hb.Seen.Before(cutoff) {
			stale = append(stale, addr)
			continue
		}
		out = append(out, router.AgentRecord{Address: addr, Status: status, Interval: hb.Interval, Seen: hb.Seen})
	}
	if len(stale) > 0 {
		if err := s.c.HDel(ctx, s.agentsKey(), stale...).Err(); err != nil {
			return out, unavailable("forget agents", err)
		}
	}
	return out, nil
}

// Sweep implements router.Store: Redis expires sessions itself, and Agents
// forgets silent agents.
func (s *Store) Sweep(context.Context, time.Time) error { return nil }
