package pool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/codemode-go/codemode/agent/internal/sandbox"
	"github.com/codemode-go/codemode/agent/internal/wire"
)

// Errors of sessions.
var (
	ErrSessionExists   = errors.New("session already exists")
	ErrSessionNotFound = errors.New("session not found")
	ErrTooManySessions = errors.New("too many sessions")
)

// TenantLimitError is the error of a new session refused because its
// tenant holds as many open sessions as one tenant may
// (SessionsConfig.MaxPerTenant). It matches ErrTooManySessions.
type TenantLimitError struct {
	// Open is the tenant's open sessions, which is also the limit.
	Open int
}

func (e *TenantLimitError) Error() string {
	return fmt.Sprintf("too many sessions: the tenant has %d open sessions, the most one tenant may hold", e.Open)
}

func (e *TenantLimitError) Unwrap() error { return ErrTooManySessions }

// EndReason says why a session ended.
type EndReason int

// Reasons a session ends.
const (
	EndClosed  EndReason = iota + 1 // closed on request
	EndExpired                      // idle for longer than its timeout
	EndLost                         // its sandbox broke, or the agent stopped
)

func (r EndReason) String() string {
	switch r {
	case EndClosed:
		return "closed"
	case EndExpired:
		return "expired"
	case EndLost:
		return "lost"
	}
	return "unknown"
}

// EndedError is the error of a call on a session that ended. It matches
// ErrSessionNotFound.
type EndedError struct {
	Reason EndReason
	Ended  time.Time
}

func (e *EndedError) Error() string {
	return fmt.Sprintf("session not found: it %s at %s", map[EndReason]string{
		EndClosed: "was closed", EndExpired: "expired", EndLost: "was lost",
	}[e.Reason], e.Ended.UTC().Format(time.RFC3339))
}

func (e *EndedError) Unwrap() error { return ErrSessionNotFound }

// MaxEnded bounds the ended sessions remembered, oldest forgotten first.
const MaxEnded = 1 << 16

// ended is what is remembered of a session that ended, so that its id is
// never opened again as a new, empty session.
type ended struct {
	tenant string
	reason EndReason
	at     time.Time
}

// SessionsConfig configures Sessions.
type SessionsConfig struct {
	// Max bounds the open sessions.
	Max int
	// MaxPerTenant bounds the open sessions of one tenant, so that one
	// tenant cannot take every session; 0: only Max does.
	MaxPerTenant int
	// IdleTTL closes a session after this long without a run, unless the
	// session was given its own.
	IdleTTL time.Duration
	// MaxIdleTTL bounds the idle time a session may ask for.
	MaxIdleTTL time.Duration
	// Journal, if not nil, records sessions on disk, so that the sessions
	// an earlier agent lost stay known as lost. Sessions does not close it.
	Journal *Journal
	Logger  *slog.Logger
}

// Sessions are sandboxes held for one user across runs.
type Sessions struct {
	pool *Pool
	cfg  SessionsConfig
	log  *slog.Logger

	mu         sync.Mutex
	m          map[string]*Session
	ended      map[string]ended
	endedOrder []string // ids in ended, oldest first
	closed     bool

	stop context.CancelFunc
	done chan struct{}
}

// Session is one open session. Its fields other than those documented as
// such are owned by Sessions.
type Session struct {
	ID       string
	Tenant   string
	Language string
	Created  time.Time

	idle    time.Duration
	memory  int64
	ready   chan struct{} // closed when sb or err is set
	sb      *Sandbox
	err     error
	turn    chan struct{} // holds a token while a run uses the sandbox
	last    time.Time     // end of the last run; guarded by Sessions.mu
	active  int           // runs in progress; guarded by Sessions.mu
	dropped bool          // guarded by Sessions.mu
}

// NewSessions returns the session table of pool and starts its janitor,
// which closes idle sessions. Close stops it.
func NewSessions(pool *Pool, cfg SessionsConfig) *Sessions {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxIdleTTL < cfg.IdleTTL {
		cfg.MaxIdleTTL = cfg.IdleTTL
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sessions{pool: pool, cfg: cfg, log: cfg.Logger, m: map[string]*Session{}, ended: map[string]ended{}, stop: cancel, done: make(chan struct{})}
	if j := cfg.Journal; j != nil {
		for id, e := range j.replay {
			s.ended[id] = e
			s.endedOrder = append(s.endedOrder, id)
		}
		slices.SortFunc(s.endedOrder, func(a, b string) int { return s.ended[a].at.Compare(s.ended[b].at) })
		j.replay = nil
	}
	go s.janitor(ctx)
	return s
}

// Info describes an open session.
type Info struct {
	ID, Language string
	Created      time.Time
	Expires      time.Time
}

func (s *Sessions) infoLocked(ss *Session) Info {
	last := ss.last
	if ss.active > 0 {
		last = time.Now()
	}
	return Info{ID: ss.ID, Language: ss.Language, Created: ss.Created, Expires: last.Add(ss.idle)}
}

// Info describes tenant's session id, if it is open, without waiting for
// its turn.
//
// # Errors
//
// [ErrSessionNotFound], or an [*EndedError] if the session ended.
func (s *Sessions) Info(id, tenant string) (Info, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.m[id]
	if !ok || ss.dropped || ss.Tenant != tenant {
		return Info{}, s.notFoundLocked(id, tenant)
	}
	return s.infoLocked(ss), nil
}

// notFoundLocked is the error for tenant's session id, which is not open:
// an [*EndedError] if it was tenant's and ended, else [ErrSessionNotFound].
func (s *Sessions) notFoundLocked(id, tenant string) error {
	if e, ok := s.ended[id]; ok && e.tenant == tenant {
		return &EndedError{Reason: e.reason, Ended: e.at}
	}
	return ErrSessionNotFound
}

// endLocked remembers that ss ended for reason.
func (s *Sessions) endLocked(ss *Session, reason EndReason) {
	if _, ok := s.ended[ss.ID]; ok {
		return
	}
	for len(s.endedOrder) >= MaxEnded {
		delete(s.ended, s.endedOrder[0])
		s.endedOrder[0] = ""
		s.endedOrder = s.endedOrder[1:]
	}
	e := ended{tenant: ss.Tenant, reason: reason, at: time.Now()}
	s.ended[ss.ID] = e
	s.endedOrder = append(s.endedOrder, ss.ID)
	if j := s.cfg.Journal; j != nil {
		if err := j.Ended(ss.ID, ss.Tenant, reason, e.at); err != nil {
			s.log.Warn("record a session's end", "session_id", ss.ID, "error", err)
		}
	}
}

// Create opens a session called id (a random id if empty) for tenant and
// language with the given idle timeout (0: the default), taking a sandbox
// for it. The id of a session that ended is not used again.
//
// # Errors
//
// [ErrSessionExists], [ErrTooManySessions], or the errors of [Pool.Acquire].
func (s *Sessions) Create(ctx context.Context, id, tenant, language string, idle time.Duration) (Info, error) {
	ss, created, err := s.open(ctx, id, tenant, language, idle, 0, createNew)
	if err != nil {
		return Info{}, err
	}
	if !created {
		return Info{}, fmt.Errorf("%w: %s", ErrSessionExists, id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.infoLocked(ss), nil
}

// Use runs fn with the sandbox of tenant's session id. If allowNew, a
// session of that id that never existed is opened (for language and
// memory, with the default idle timeout). Runs of one session take turns.
// If fn reports the sandbox broken, the session is closed.
//
// # Errors
//
// [ErrSessionNotFound] or an [*EndedError] if there is no such session
// (and it may not or cannot be opened), and the errors of [Sessions.Create].
func (s *Sessions) Use(ctx context.Context, id, tenant, language string, memory int64, allowNew bool, fn func(*Sandbox) (broken bool, err error)) (Info, error) {
	mode := existing
	if allowNew {
		mode = openOrNew
	}
	return s.use(ctx, id, tenant, language, memory, mode, fn)
}

func (s *Sessions) use(ctx context.Context, id, tenant, language string, memory int64, mode openMode, fn func(*Sandbox) (broken bool, err error)) (Info, error) {
	ss, _, err := s.open(ctx, id, tenant, language, 0, memory, mode)
	if err != nil {
		return Info{}, err
	}
	select {
	case ss.turn <- struct{}{}:
	case <-ctx.Done():
		return Info{}, fmt.Errorf("wait for the session's previous run: %w", ctx.Err())
	}
	s.mu.Lock()
	if ss.dropped {
		err := s.notFoundLocked(id, tenant)
		s.mu.Unlock()
		<-ss.turn
		return Info{}, err
	}
	ss.active++
	s.mu.Unlock()

	broken, err := fn(ss.sb)

	s.mu.Lock()
	ss.active--
	ss.last = time.Now()
	info := s.infoLocked(ss)
	s.mu.Unlock()
	<-ss.turn
	if broken {
		s.drop(ss, EndLost, "sandbox broken")
	}
	return info, err
}

// With runs fn with the sandbox of tenant's open session id, taking the
// session's turn as a run does.
//
// # Errors
//
// [ErrSessionNotFound] or an [*EndedError] if there is no such session.
func (s *Sessions) With(ctx context.Context, id, tenant string, fn func(*Sandbox) error) error {
	_, err := s.use(ctx, id, tenant, "", 0, existing, func(sb *Sandbox) (bool, error) {
		err := fn(sb)
		return errors.Is(err, wire.ErrRunnerGone), err
	})
	return err
}

// How open treats a session id.
type openMode int

const (
	createNew openMode = iota // a new session; an existing one is an error
	openOrNew                 // an existing session, or a new one
	existing                  // an existing session only
)

// open finds or creates tenant's session id. A session of another tenant
// is not found (or, for createNew, exists); one that ended is an
// [*EndedError] and is never opened again.
func (s *Sessions) open(ctx context.Context, id, tenant, language string, idle time.Duration, memory int64, mode openMode) (*Session, bool, error) {
	if idle <= 0 {
		idle = s.cfg.IdleTTL
	}
	idle = min(idle, s.cfg.MaxIdleTTL)
	s.mu.Lock()
	ss, isNew, err := s.claimLocked(id, tenant, language, idle, memory, mode)
	s.mu.Unlock()
	if err != nil {
		return nil, false, err
	}
	if !isNew {
		select {
		case <-ss.ready:
		case <-ctx.Done():
			return nil, false, fmt.Errorf("wait for session %s to start: %w", ss.ID, ctx.Err())
		}
		if ss.err != nil {
			return nil, false, ss.err
		}
		return ss, false, nil
	}
	sb, err := s.pool.Hold(ctx, memory)
	s.start(ss, sb, err)
	if ss.err != nil {
		return nil, false, ss.err
	}
	s.pool.cfg.Metrics.sessionOpened()
	s.log.Info("session opened", "session_id", ss.ID, "tenant", tenant, "language", language, "sandbox_id", sandbox.ShortID(sb.ID()))
	return ss, true, nil
}

// claimLocked returns tenant's session id as open finds it, or a new
// session under that id (a new id when it is empty), reserved in s.m and
// not ready until start; isNew says which. s.mu must be held.
func (s *Sessions) claimLocked(id, tenant, language string, idle time.Duration, memory int64, mode openMode) (ss *Session, isNew bool, err error) {
	if s.closed {
		return nil, false, ErrClosed
	}
	if id == "" {
		id = newSessionID()
	}
	if e, ok := s.ended[id]; ok {
		if mode == createNew {
			return nil, false, fmt.Errorf("%w: the id belonged to a session that ended; ids are not used again", ErrSessionExists)
		}
		if e.tenant != tenant {
			return nil, false, ErrSessionNotFound
		}
		return nil, false, &EndedError{Reason: e.reason, Ended: e.at}
	}
	if ss, ok := s.m[id]; ok {
		if mode == createNew {
			return nil, false, ErrSessionExists
		}
		if ss.Tenant != tenant {
			return nil, false, ErrSessionNotFound
		}
		return ss, false, nil
	}
	if mode == existing {
		return nil, false, ErrSessionNotFound
	}
	if n := s.cfg.MaxPerTenant; n > 0 && s.tenantLenLocked(tenant) >= n {
		return nil, false, &TenantLimitError{Open: n}
	}
	if len(s.m) >= s.cfg.Max {
		return nil, false, fmt.Errorf("%w: all %d sessions are open", ErrTooManySessions, s.cfg.Max)
	}
	now := time.Now()
	ss = &Session{
		ID: id, Tenant: tenant, Language: language, Created: now, idle: idle, memory: memory,
		ready: make(chan struct{}), turn: make(chan struct{}, 1), last: now,
	}
	s.m[id] = ss
	return ss, true, nil
}

// start gives the new session ss its sandbox sb, or its failure err to
// hold one, and makes it ready. A session dropped or closed while it
// waited gets no sandbox: sb goes back to the pool, and the session's
// error says it is not found.
func (s *Sessions) start(ss *Session, sb *Sandbox, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil:
		ss.err = err
		delete(s.m, ss.ID)
	case ss.dropped || s.closed:
		ss.err = s.notFoundLocked(ss.ID, ss.Tenant)
		s.pool.Drop(sb)
	default:
		ss.sb = sb
		ss.last = time.Now()
		// Recorded under the lock, so that its end is always recorded after it.
		if j := s.cfg.Journal; j != nil {
			if err := j.Opened(ss.ID, ss.Tenant, ss.Created); err != nil {
				s.log.Warn("record a session", "session_id", ss.ID, "error", err)
			}
		}
	}
	close(ss.ready)
}

// Close closes tenant's session id and destroys its sandbox, also under a
// run in progress (which then fails).
//
// # Errors
//
// [ErrSessionNotFound] or an [*EndedError] if there is no such session.
func (s *Sessions) Close(id, tenant string) error {
	s.mu.Lock()
	ss, ok := s.m[id]
	if !ok || ss.Tenant != tenant {
		err := s.notFoundLocked(id, tenant)
		s.mu.Unlock()
		return err
	}
	s.mu.Unlock()
	s.drop(ss, EndClosed, "closed")
	return nil
}

// drop removes ss from the table, remembers that it ended for reason, and
// destroys its sandbox once it has one.
func (s *Sessions) drop(ss *Session, reason EndReason, why string) {
	s.mu.Lock()
	if ss.dropped {
		s.mu.Unlock()
		return
	}
	ss.dropped = true
	s.endLocked(ss, reason)
	if ss.sb != nil {
		// Opened (one still starting is not counted either way).
		s.pool.cfg.Metrics.sessionClosed(reason)
	}
	if s.m[ss.ID] == ss {
		delete(s.m, ss.ID)
	}
	s.mu.Unlock()
	select {
	case <-ss.ready:
		if ss.sb != nil {
			s.pool.Drop(ss.sb)
		}
	default:
		// Still starting: open sees dropped and gives the sandbox back.
	}
	s.log.Info("session closed", "session_id", ss.ID, "reason", why)
}

// Len returns the number of open sessions.
func (s *Sessions) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// tenantLenLocked returns the number of tenant's open sessions, those
// still starting included. s.mu is held.
func (s *Sessions) tenantLenLocked(tenant string) int {
	n := 0
	for _, ss := range s.m {
		if ss.Tenant == tenant {
			n++
		}
	}
	return n
}

// ByTenant returns the number of open sessions of each tenant that has
// one, those still starting included.
func (s *Sessions) ByTenant() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int)
	for _, ss := range s.m {
		out[ss.Tenant]++
	}
	return out
}

// Running returns the number of sessions running code now.
func (s *Sessions) Running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ss := range s.m {
		if ss.active > 0 {
			n++
		}
	}
	return n
}

// CloseAll closes every session and stops the janitor.
func (s *Sessions) CloseAll() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	all := make([]*Session, 0, len(s.m))
	for _, ss := range s.m {
		all = append(all, ss)
	}
	s.mu.Unlock()
	s.stop()
	<-s.done
	for _, ss := range all {
		s.drop(ss, EndLost, "agent stopping")
	}
}

// janitor closes sessions that have been idle for longer than their TTL.
func (s *Sessions) janitor(ctx context.Context) {
	defer close(s.done)
	every := min(max(s.cfg.IdleTTL/10, 100*time.Millisecond), 5*time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		var idle []*Session
		s.mu.Lock()
		for _, ss := range s.m {
			select {
			case <-ss.ready:
			default:
				continue
			}
			if ss.active == 0 && ss.sb != nil && now.Sub(ss.last) > ss.idle {
				idle = append(idle, ss)
			}
		}
		s.mu.Unlock()
		for _, ss := range idle {
			s.drop(ss, EndExpired, "idle")
		}
	}
}

func newSessionID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "s-" + hex.EncodeToString(b)
}
