package pool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/codemode-go/codemode/agent/internal/wire"
)

// Errors of sessions.
var (
	ErrSessionExists   = errors.New("session already exists")
	ErrSessionNotFound = errors.New("session not found")
	ErrTooManySessions = errors.New("too many sessions")
)

// SessionsConfig configures Sessions.
type SessionsConfig struct {
	// Max bounds the open sessions.
	Max int
	// IdleTTL closes a session after this long without a run, unless the
	// session was given its own.
	IdleTTL time.Duration
	// MaxIdleTTL bounds the idle time a session may ask for.
	MaxIdleTTL time.Duration
	Logger     *slog.Logger
}

// Sessions are sandboxes held for one user across runs.
type Sessions struct {
	pool *Pool
	cfg  SessionsConfig
	log  *slog.Logger

	mu     sync.Mutex
	m      map[string]*Session
	closed bool

	stop context.CancelFunc
	done chan struct{}
}

// Session is one open session. Its fields other than those documented as
// such are owned by Sessions.
type Session struct {
	ID       string
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
	s := &Sessions{pool: pool, cfg: cfg, log: cfg.Logger, m: map[string]*Session{}, stop: cancel, done: make(chan struct{})}
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

// Info describes session id, if it is open, without waiting for its turn.
func (s *Sessions) Info(id string) (Info, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.m[id]
	if !ok || ss.dropped {
		return Info{}, false
	}
	return s.infoLocked(ss), true
}

// Create opens a session called id (a random id if empty) for language
// with the given idle timeout (0: the default), taking a sandbox for it.
//
// # Errors
//
// [ErrSessionExists], [ErrTooManySessions], or the errors of [Pool.Acquire].
func (s *Sessions) Create(ctx context.Context, id, language string, idle time.Duration) (Info, error) {
	ss, created, err := s.open(ctx, id, language, idle, 0, createNew)
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

// Use runs fn with the sandbox of session id, creating the session if
// there is none of that name (for language and memory, with the default
// idle timeout). Runs of one session take turns. If fn reports the sandbox
// broken, the session is closed.
func (s *Sessions) Use(ctx context.Context, id, language string, memory int64, fn func(*Sandbox) (broken bool, err error)) (Info, error) {
	return s.use(ctx, id, language, memory, openOrNew, fn)
}

func (s *Sessions) use(ctx context.Context, id, language string, memory int64, mode openMode, fn func(*Sandbox) (broken bool, err error)) (Info, error) {
	ss, _, err := s.open(ctx, id, language, 0, memory, mode)
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
		s.mu.Unlock()
		<-ss.turn
		return Info{}, fmt.Errorf("%w: %s was closed", ErrSessionNotFound, id)
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
		s.drop(ss, "sandbox broken")
	}
	return info, err
}

// With runs fn with the sandbox of the open session id, taking the
// session's turn as a run does.
//
// # Errors
//
// [ErrSessionNotFound] if there is no such session.
func (s *Sessions) With(ctx context.Context, id string, fn func(*Sandbox) error) error {
	_, err := s.use(ctx, id, "", 0, existing, func(sb *Sandbox) (bool, error) {
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

// open finds or creates a session.
func (s *Sessions) open(ctx context.Context, id, language string, idle time.Duration, memory int64, mode openMode) (*Session, bool, error) {
	if idle <= 0 {
		idle = s.cfg.IdleTTL
	}
	idle = min(idle, s.cfg.MaxIdleTTL)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, false, ErrClosed
	}
	if id == "" {
		id = newSessionID()
	}
	if ss, ok := s.m[id]; ok {
		s.mu.Unlock()
		if mode == createNew {
			return nil, false, fmt.Errorf("%w: %s", ErrSessionExists, id)
		}
		select {
		case <-ss.ready:
		case <-ctx.Done():
			return nil, false, fmt.Errorf("wait for session %s to start: %w", id, ctx.Err())
		}
		if ss.err != nil {
			return nil, false, ss.err
		}
		return ss, false, nil
	}
	if mode == existing {
		s.mu.Unlock()
		return nil, false, fmt.Errorf("%w: %s", ErrSessionNotFound, id)
	}
	if len(s.m) >= s.cfg.Max {
		s.mu.Unlock()
		return nil, false, fmt.Errorf("%w: all %d sessions are open", ErrTooManySessions, s.cfg.Max)
	}
	now := time.Now()
	ss := &Session{
		ID: id, Language: language, Created: now, idle: idle, memory: memory,
		ready: make(chan struct{}), turn: make(chan struct{}, 1), last: now,
	}
	s.m[id] = ss
	s.mu.Unlock()

	sb, err := s.pool.Hold(ctx, memory)
	s.mu.Lock()
	if err != nil {
		ss.err = err
		delete(s.m, id)
	} else if ss.dropped || s.closed {
		ss.err = fmt.Errorf("%w: %s was closed", ErrSessionNotFound, id)
		s.pool.Drop(sb)
	} else {
		ss.sb = sb
		ss.last = time.Now()
	}
	close(ss.ready)
	s.mu.Unlock()
	if ss.err != nil {
		return nil, false, ss.err
	}
	s.log.Info("session opened", "session_id", id, "language", language, "sandbox_id", shortID(sb.ID()))
	return ss, true, nil
}

// Close closes session id and destroys its sandbox, also under a run in
// progress (which then fails).
func (s *Sessions) Close(id string) error {
	s.mu.Lock()
	ss, ok := s.m[id]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", ErrSessionNotFound, id)
	}
	s.drop(ss, "closed")
	return nil
}

// drop removes ss from the table and destroys its sandbox once it has one.
func (s *Sessions) drop(ss *Session, why string) {
	s.mu.Lock()
	if ss.dropped {
		s.mu.Unlock()
		return
	}
	ss.dropped = true
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
		s.drop(ss, "agent stopping")
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
			s.drop(ss, "idle")
		}
	}
}

func newSessionID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "s-" + hex.EncodeToString(b)
}
