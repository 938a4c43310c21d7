// Package redisstore keeps the control plane's shared state in Redis, so
// that several control planes route the same sessions and know the same
// agents: each session's binding (agent address, tenant, confirmed) or
// tombstone (why and when it ended), and each agent's last heartbeat.
//
// Keys, under a prefix (DefaultPrefix):
//
//	<prefix>session:<id>  string, a sealed record of router.Binding; expires
//	                      router.SessionTTL after its last read or write
//	<prefix>agents        hash, agent address -> a sealed record of its last
//	                      heartbeat (status, interval, when); entries older
//	                      than router.ForgetAgentAfter are deleted when read
//
// A new binding is written with SET NX GET (one round trip: the first
// replica's choice wins and the others read it back), and confirming a
// binding or ending a session runs a script that leaves a tombstone alone,
// so a closed session is never bound again.
//
// # Sealed records
//
// Every value is JSON {"v": record, "mac": HMAC-SHA256}, the MAC taken
// under a key derived from the cluster secret over the record's Redis key,
// its hash field (the agent's address) and the record's bytes. Write access
// to Redis alone therefore cannot add an agent, nor bind a session to an
// agent, nor move a record to another key: a record whose MAC is missing
// or wrong is ignored (logged once at warn, without the record): an agent
// entry is skipped, a session's record is taken as none (the control plane
// then asks its agents, as after a restart) and is replaced by the next
// write. What a MAC cannot stop: deleting records, and putting back a
// genuine record of the same key that was there before (an old heartbeat
// expires by its own time; an old binding names the agent that held the
// session, which checks the session's tenant itself).
//
// # Errors
//
// Every failure, Redis's or a sealed record that does not decode, wraps
// router.ErrStoreUnavailable.
package redisstore

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"sync"
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

// KeyPurpose names the key that seals records (cluster.Secret.Key).
const KeyPurpose = "codemode redis records v1"

// Store is a router.Store in Redis. Safe for concurrent use.
type Store struct {
	c      *redis.Client
	prefix string
	key    []byte
	logger *slog.Logger
	now    func() time.Time

	macs sync.Pool // of hash.Hash: HMAC-SHA256 under key

	mu     sync.Mutex
	forged map[string]bool // records reported as failing their check
}

var _ router.Store = (*Store)(nil)

// MinKeyLen is the length of the shortest key New takes, in bytes.
const MinKeyLen = 32

// New returns a Store on the Redis at url (redis://[user:password@]host:port[/db],
// or rediss:// for TLS) whose keys start with prefix, sealing its records
// under key (at least MinKeyLen bytes: cluster.Secret.Key(KeyPurpose), the
// same for every control plane sharing the Redis; without a cluster secret
// that key derives from a fixed value and the MAC authenticates nothing, as
// fits a control plane that serves loopback only, see
// controlplane/RATIONALE.md). Records that fail their check are reported to
// logger. With rediss://, trust (if set) gives the TLS configuration of a
// connection to the Redis's host name, trusting the CAs that signed its
// certificate, such as the cluster's (cluster.Links.ClientTLS, which follows
// the --cluster-ca file as it changes); else the system's CAs are trusted.
// It does not connect until first used; Ping checks the server.
func New(url, prefix string, key []byte, logger *slog.Logger, trust func(serverName string) *tls.Config) (*Store, error) {
	if len(key) < MinKeyLen {
		return nil, fmt.Errorf("redis store: the key is %d bytes, want at least %d", len(key), MinKeyLen)
	}
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	if opts.TLSConfig != nil && trust != nil {
		// rediss:// to a Redis whose certificate a private CA signed.
		if c := trust(opts.TLSConfig.ServerName); c != nil {
			opts.TLSConfig = c
		}
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = Timeout, Timeout, Timeout
	opts.ContextTimeoutEnabled = true
	opts.MaxRetries = 1
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{c: redis.NewClient(opts), prefix: prefix, key: key, logger: logger, now: time.Now, forged: map[string]bool{}}
	s.macs.New = func() any { return hmac.New(sha256.New, s.key) }
	return s, nil
}

// sealed is a record as kept in Redis.
type sealed struct {
	V   json.RawMessage `json:"v"`
	MAC []byte          `json:"mac"`
}

// mac returns the MAC of record v kept at Redis key and field.
func (s *Store) mac(key, field string, v []byte) []byte {
	m := s.macs.Get().(hash.Hash)
	defer s.macs.Put(m)
	m.Reset()
	var n [8]byte
	for _, part := range []string{key, field} {
		binary.BigEndian.PutUint64(n[:], uint64(len(part)))
		m.Write(n[:])
		io.WriteString(m, part)
	}
	binary.BigEndian.PutUint64(n[:], uint64(len(v)))
	m.Write(n[:])
	m.Write(v)
	return m.Sum(nil)
}

// seal returns what to keep at Redis key and field for rec: its JSON and
// their MAC.
func (s *Store) seal(key, field string, rec any) ([]byte, error) {
	v, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	return json.Marshal(sealed{V: v, MAC: s.mac(key, field, v)})
}

// open decodes into rec what Redis keeps at key and field, and reports
// whether it is genuine. A record that fails its check is reported once
// and left alone: false, with no error.
func (s *Store) open(key, field string, stored []byte, rec any) (bool, error) {
	var sl sealed
	if err := json.Unmarshal(stored, &sl); err != nil || len(sl.V) == 0 || !hmac.Equal(sl.MAC, s.mac(key, field, sl.V)) {
		s.reportForged(key, field, stored)
		return false, nil
	}
	if err := json.Unmarshal(sl.V, rec); err != nil {
		return false, err // sealed by this cluster, yet not this record: a newer control plane's?
	}
	return true, nil
}

// maxForgedReported bounds the records remembered as reported.
const maxForgedReported = 1024

// reportForged logs a record that failed its check, once per record.
func (s *Store) reportForged(key, field string, stored []byte) {
	sum := sha256.Sum256(stored)
	id := key + "\x00" + field + "\x00" + string(sum[:])
	s.mu.Lock()
	seen := s.forged[id]
	if !seen {
		if len(s.forged) >= maxForgedReported {
			clear(s.forged)
		}
		s.forged[id] = true
	}
	s.mu.Unlock()
	if seen {
		return
	}
	args := []any{"key", key}
	if field != "" {
		args = append(args, "agent", field)
	}
	s.logger.Warn("ignoring a record in redis that fails its check: written by something without this cluster's secret, altered, or sealed under another secret", args...)
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
	b, ok, err := s.openBinding(id, v)
	if err != nil || !ok {
		return router.Binding{}, false, err
	}
	return b, true, nil
}

// openBinding decodes session id's stored record; false when it fails its
// check.
func (s *Store) openBinding(id string, stored []byte) (router.Binding, bool, error) {
	var b router.Binding
	ok, err := s.open(s.sessionKey(id), "", stored, &b)
	if err != nil {
		return router.Binding{}, false, unavailable("decode session", err)
	}
	return b, ok, nil
}

// replaceAttempts bounds the writes that replace a record failing its
// check, should another such record take its place each time.
const replaceAttempts = 3

// errForgedAgain is the failure to replace a record that fails its check.
var errForgedAgain = errors.New("records failing their check keep replacing each other")

// BindNew implements router.Store: SET NX GET, one round trip. A record
// there that fails its check is replaced, by a script that replaces it only
// while it is still there (another replica may have replaced it first).
func (s *Store) BindNew(ctx context.Context, id string, b router.Binding) (router.Binding, error) {
	key := s.sessionKey(id)
	v, err := s.seal(key, "", b)
	if err != nil {
		return router.Binding{}, err
	}
	old, err := s.c.SetArgs(ctx, key, v, redis.SetArgs{Mode: "NX", Get: true, TTL: router.SessionTTL}).Result()
	for range replaceAttempts {
		if errors.Is(err, redis.Nil) {
			return b, nil // set: there was nothing, or a record that failed its check
		}
		if err != nil {
			return router.Binding{}, unavailable("bind session", err)
		}
		had, ok, derr := s.openBinding(id, []byte(old))
		if derr != nil || ok {
			return had, derr
		}
		old, err = replaceIf.Run(ctx, s.c, []string{key}, old, v, router.SessionTTL.Milliseconds()).Text()
	}
	return router.Binding{}, unavailable("bind session", errForgedAgain)
}

// replaceIf sets KEYS[1] to ARGV[2] for ARGV[3] milliseconds if it holds
// ARGV[1] or nothing, and returns nil; else it returns what it holds.
var replaceIf = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return v end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return false
`)

// setUnlessEnded sets KEYS[1] to ARGV[1] for ARGV[2] milliseconds unless it
// holds a tombstone other than ARGV[3], and returns nil; else it returns the
// tombstone. (The script cannot check a record's MAC: the caller does, and
// names in ARGV[3] a tombstone that failed it, to be replaced.)
var setUnlessEnded = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[3] then
  local ok, d = pcall(cjson.decode, v)
  if ok and type(d) == 'table' and type(d['v']) == 'table' and d['v']['gone'] ~= nil then return v end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
`)

func (s *Store) setUnlessEnded(ctx context.Context, id string, b router.Binding) error {
	key := s.sessionKey(id)
	v, err := s.seal(key, "", b)
	if err != nil {
		return err
	}
	forged := ""
	for range replaceAttempts {
		old, err := setUnlessEnded.Run(ctx, s.c, []string{key}, v, router.SessionTTL.Milliseconds(), forged).Text()
		if errors.Is(err, redis.Nil) {
			return nil // set
		}
		if err != nil {
			return unavailable("write session", err)
		}
		if _, ok, err := s.openBinding(id, []byte(old)); err != nil || ok {
			return err // a genuine tombstone stays
		}
		forged = old
	}
	return unavailable("write session", errForgedAgain)
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
	v, err := s.seal(s.agentsKey(), rec.Address, heartbeat{Status: status, Interval: rec.Interval, Seen: rec.Seen})
	if err != nil {
		return err
	}
	return unavailable("record heartbeat", s.c.HSet(ctx, s.agentsKey(), rec.Address, v).Err())
}

// Agents implements router.Store: HGETALL, and HDEL of the agents not
// heard from in router.ForgetAgentAfter. An entry that fails its check is
// skipped.
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
		ok, err := s.open(s.agentsKey(), addr, []byte(v), &hb)
		if err != nil {
			return nil, unavailable("decode agent "+addr, err)
		}
		if !ok {
			continue
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
