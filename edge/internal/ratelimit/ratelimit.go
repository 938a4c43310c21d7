// Package ratelimit limits each tenant's calls: how many may be in flight at
// once, and how many may start per second (a token bucket). A tenant over a
// limit is refused at once, with the limit it hit and when to retry; other
// tenants are not affected.
//
// A Limiter keeps one small record per tenant it has seen, for as long as it
// lives. That is bounded because tenants are the names in the edge's API-key
// file (read once at start-up) plus "anonymous"; a caller cannot invent one.
// A Limiter fed tenants from an open-ended source would need to forget idle
// ones.
//
// A Limiter is safe for concurrent use.
package ratelimit

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
)

// Config sets the limits that apply to every tenant. The zero Config limits
// nothing.
type Config struct {
	// Concurrency is how many calls of one tenant may be in flight at once;
	// 0: no limit.
	Concurrency int
	// Rate is how many calls of one tenant may start per second, on average;
	// 0: no limit.
	Rate float64
	// Burst is how many calls of one tenant may start at once after a quiet
	// spell, above Rate: the size of the token bucket. It must be at least 1
	// when Rate is set.
	Burst int
}

// Defaults for the edge's flags.
const (
	DefaultConcurrency = 16
	DefaultRate        = 50
	DefaultBurst       = 100
)

// Validate reports whether c can be used.
func (c Config) Validate() error {
	var errs []error
	if c.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("tenant concurrency %d is negative", c.Concurrency))
	}
	if c.Rate < 0 || math.IsNaN(c.Rate) || math.IsInf(c.Rate, 0) {
		errs = append(errs, fmt.Errorf("tenant rate %v: want a finite number >= 0", c.Rate))
	}
	if c.Rate > 0 && c.Burst < 1 {
		errs = append(errs, fmt.Errorf("tenant burst %d: want at least 1 when a rate is set", c.Burst))
	}
	return errors.Join(errs...)
}

// ConcurrencyRetry is the retry hint given to a tenant over its concurrency
// limit. When one of its calls will end is not known; this is about the
// time a short run takes.
const ConcurrencyRetry = 200 * time.Millisecond

// Limit names a limit.
type Limit string

// The limits.
const (
	LimitConcurrency Limit = "concurrency"
	LimitRate        Limit = "rate"
)

// ExceededError is the error of a call refused because its tenant is over a
// limit.
type ExceededError struct {
	Tenant string
	Limit  Limit
	// Config is the Limiter's configuration, for the message.
	Config Config
	// RetryAfter is how long the tenant should wait before trying again.
	RetryAfter time.Duration
}

func (e *ExceededError) Error() string {
	retry := e.RetryAfter.Round(time.Millisecond)
	if retry <= 0 {
		retry = time.Millisecond
	}
	switch e.Limit {
	case LimitConcurrency:
		return fmt.Sprintf("tenant %q has %d calls in flight, its concurrency limit: retry after %s", e.Tenant, e.Config.Concurrency, retry)
	default:
		return fmt.Sprintf("tenant %q is over its rate limit of %g calls/s (burst %d): retry after %s", e.Tenant, e.Config.Rate, e.Config.Burst, retry)
	}
}

// ConnectError returns e as the error every door reports: Connect's
// resource_exhausted with e's message, and metadata holding a Retry-After
// header (whole seconds, at least 1, as HTTP wants it) for the doors that
// send headers.
func (e *ExceededError) ConnectError() *connect.Error {
	ce := connect.NewError(connect.CodeResourceExhausted, e)
	ce.Meta().Set("Retry-After", strconv.FormatInt(max(1, int64((e.RetryAfter+time.Second-1)/time.Second)), 10))
	return ce
}

// Limiter applies a Config to each tenant.
type Limiter struct {
	cfg Config
	now func() time.Time

	mu      sync.Mutex
	tenants map[string]*bucket
}

// bucket is one tenant's state.
type bucket struct {
	inFlight int
	tokens   float64   // when Rate > 0: tokens left at last
	last     time.Time // when tokens was computed
}

// New returns a Limiter that applies cfg, which must be valid (see
// Config.Validate).
func New(cfg Config) *Limiter {
	return newWithClock(cfg, time.Now)
}

func newWithClock(cfg Config, now func() time.Time) *Limiter {
	return &Limiter{cfg: cfg, now: now, tenants: make(map[string]*bucket)}
}

// Config returns the limits l applies.
func (l *Limiter) Config() Config { return l.cfg }

// Acquire admits one call of tenant, or refuses it with an *ExceededError
// when the tenant has Concurrency calls in flight or has used up its
// tokens. A refused call takes neither a slot nor a token. On success the
// caller must call release once the call has ended; calling it again does
// nothing.
func (l *Limiter) Acquire(tenant string) (release func(), err error) {
	if l.cfg.Concurrency == 0 && l.cfg.Rate == 0 {
		return func() {}, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.tenants[tenant]
	if b == nil {
		b = &bucket{tokens: float64(l.cfg.Burst)}
		if l.cfg.Rate > 0 {
			b.last = l.now()
		}
		l.tenants[tenant] = b
	}
	if l.cfg.Concurrency > 0 && b.inFlight >= l.cfg.Concurrency {
		return nil, &ExceededError{Tenant: tenant, Limit: LimitConcurrency, Config: l.cfg, RetryAfter: ConcurrencyRetry}
	}
	if l.cfg.Rate > 0 {
		now := l.now()
		if d := now.Sub(b.last); d > 0 {
			b.tokens = min(float64(l.cfg.Burst), b.tokens+d.Seconds()*l.cfg.Rate)
			b.last = now
		}
		if b.tokens < 1 {
			wait := time.Duration(math.Ceil((1 - b.tokens) / l.cfg.Rate * float64(time.Second)))
			return nil, &ExceededError{Tenant: tenant, Limit: LimitRate, Config: l.cfg, RetryAfter: wait}
		}
		b.tokens--
	}
	b.inFlight++
	released := false
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if !released {
			released = true
			b.inFlight--
		}
	}, nil
}

// InFlight returns how many calls of tenant are in flight.
func (l *Limiter) InFlight(tenant string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := l.tenants[tenant]; b != nil {
		return b.inFlight
	}
	return 0
}
