package ratelimit

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a fake time source that moves only when told.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Unix(1_700_000_000, 0)} }

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

func exceeded(t *testing.T, err error, limit Limit) *ExceededError {
	t.Helper()
	var ex *ExceededError
	if !errors.As(err, &ex) {
		t.Fatalf("got %v, want an ExceededError (%s)", err, limit)
	}
	if ex.Limit != limit {
		t.Fatalf("limit %q, want %q (%v)", ex.Limit, limit, err)
	}
	return ex
}

func TestConcurrency(t *testing.T) {
	t.Parallel()
	l := New(Config{Concurrency: 2})
	r1, err := l.Acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.Acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire("a")
	ex := exceeded(t, err, LimitConcurrency)
	if ex.RetryAfter != ConcurrencyRetry || ex.Tenant != "a" {
		t.Errorf("got %+v", ex)
	}
	if msg := err.Error(); !strings.Contains(msg, "concurrency limit") || !strings.Contains(msg, "retry after 200ms") || !strings.Contains(msg, `"a"`) {
		t.Errorf("message %q does not say which limit, whose, and when to retry", msg)
	}
	// Another tenant is not affected.
	rb, err := l.Acquire("b")
	if err != nil {
		t.Fatalf("tenant b refused while a is at its limit: %v", err)
	}
	rb()
	// Releasing twice frees one slot only.
	r1()
	r1()
	if n := l.InFlight("a"); n != 1 {
		t.Fatalf("in flight %d after one release, want 1", n)
	}
	r3, err := l.Acquire("a")
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := l.Acquire("a"); err == nil {
		t.Fatal("a double release freed a second slot")
	}
	r2()
	r3()
	if n := l.InFlight("a"); n != 0 {
		t.Fatalf("in flight %d after every release, want 0", n)
	}
}

func TestRate(t *testing.T) {
	t.Parallel()
	c := newClock()
	l := newWithClock(Config{Rate: 10, Burst: 3}, c.now)
	for i := range 3 {
		release, err := l.Acquire("a")
		if err != nil {
			t.Fatalf("call %d within the burst: %v", i, err)
		}
		release()
	}
	_, err := l.Acquire("a")
	ex := exceeded(t, err, LimitRate)
	if ex.RetryAfter != 100*time.Millisecond {
		t.Errorf("retry after %s, want 100ms (one token at 10/s)", ex.RetryAfter)
	}
	if msg := err.Error(); !strings.Contains(msg, "rate limit of 10 calls/s (burst 3)") || !strings.Contains(msg, "retry after 100ms") {
		t.Errorf("message %q", msg)
	}
	// A refusal takes no token: after 60 ms, 0.6 token, retry in 40 ms.
	c.advance(60 * time.Millisecond)
	_, err = l.Acquire("a")
	if ex := exceeded(t, err, LimitRate); ex.RetryAfter != 40*time.Millisecond {
		t.Errorf("retry after %s, want 40ms", ex.RetryAfter)
	}
	c.advance(40 * time.Millisecond)
	if _, err := l.Acquire("a"); err != nil {
		t.Fatalf("after the retry hint: %v", err)
	}
	// Another tenant has its own bucket.
	if _, err := l.Acquire("b"); err != nil {
		t.Fatalf("tenant b: %v", err)
	}
	// The bucket refills up to the burst, no further.
	c.advance(time.Hour)
	for i := range 3 {
		if _, err := l.Acquire("a"); err != nil {
			t.Fatalf("call %d after a quiet hour: %v", i, err)
		}
	}
	if _, err := l.Acquire("a"); err == nil {
		t.Fatal("the bucket held more than its burst")
	}
}

// TestRateAndConcurrency checks that a call refused by one limit takes
// nothing from the other.
func TestRateAndConcurrency(t *testing.T) {
	t.Parallel()
	c := newClock()
	l := newWithClock(Config{Concurrency: 1, Rate: 1, Burst: 2}, c.now)
	release, err := l.Acquire("a")
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		_, err := l.Acquire("a")
		exceeded(t, err, LimitConcurrency)
	}
	release()
	// One token left: the five refusals took none.
	if _, err := l.Acquire("a"); err != nil {
		t.Fatalf("the concurrency refusals took tokens: %v", err)
	}
}

func TestUnlimited(t *testing.T) {
	t.Parallel()
	l := New(Config{})
	for range 10_000 {
		if _, err := l.Acquire("a"); err != nil {
			t.Fatal(err)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg Config
		ok  bool
	}{
		"zero":             {Config{}, true},
		"defaults":         {Config{Concurrency: DefaultConcurrency, Rate: DefaultRate, Burst: DefaultBurst}, true},
		"negative":         {Config{Concurrency: -1}, false},
		"negative rate":    {Config{Rate: -1, Burst: 1}, false},
		"rate no burst":    {Config{Rate: 5}, false},
		"burst no rate":    {Config{Burst: 5}, true},
		"fractional rate":  {Config{Rate: 0.5, Burst: 1}, true},
		"concurrency only": {Config{Concurrency: 3}, true},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestConcurrentTenants runs many goroutines of two tenants; neither ever
// has more calls in flight than the limit, and the busy one never starves
// the other.
func TestConcurrentTenants(t *testing.T) {
	t.Parallel()
	const limit = 4
	l := New(Config{Concurrency: limit})
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := map[string]int{}
	for g := range 32 {
		tenant := "busy"
		if g%8 == 0 {
			tenant = "quiet"
		}
		wg.Go(func() {
			for range 200 {
				release, err := l.Acquire(tenant)
				if err != nil {
					continue
				}
				if n := l.InFlight(tenant); n > limit {
					t.Errorf("%s has %d in flight, over %d", tenant, n, limit)
				}
				mu.Lock()
				admitted[tenant]++
				mu.Unlock()
				release()
			}
		})
	}
	wg.Wait()
	if admitted["quiet"] == 0 || admitted["busy"] == 0 {
		t.Fatalf("admitted %v", admitted)
	}
	if l.InFlight("busy") != 0 || l.InFlight("quiet") != 0 {
		t.Fatal("slots leaked")
	}
}

func BenchmarkAcquire(b *testing.B) {
	l := New(Config{Concurrency: DefaultConcurrency, Rate: 1e12, Burst: DefaultBurst})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			release, err := l.Acquire("a")
			if err != nil {
				b.Fatal(err)
			}
			release()
		}
	})
}
