package pool

import (
	"slices"
	"testing"
	"time"

	"github.com/codemode-go/codemode/internal/testkit"
)

// A warm start runs at a low CPU weight until its runner is ready; it is
// raised at once when a caller waits, or after yieldFor; a start for a
// caller who waits for it is never lowered. Each start is raised once.
func TestPoolWarmStartsYieldTheCPU(t *testing.T) {
	t.Parallel()
	lowThenDefault := []int64{startShares, defaultShares}
	weights := func(d *fakeDriver, id string) []int64 {
		if c := d.get(id); c != nil {
			return c.weights()
		}
		return nil
	}
	t.Run("until ready", func(t *testing.T) {
		t.Parallel()
		d := newFakeDriver()
		p := newTestPool(t, d, nil)
		testkit.WaitFor(t, 10*time.Second, "a warm sandbox", func() bool { return p.Stats().Warm == 1 })
		if got := weights(d, "c001"); !slices.Equal(got, lowThenDefault) {
			t.Errorf("weights of a warm start: %v, want %v", got, lowThenDefault)
		}
	})
	t.Run("a caller waits", func(t *testing.T) {
		t.Parallel()
		d := newFakeDriver()
		d.ready = make(chan struct{})
		p := newTestPool(t, d, func(c *Config) { c.Max, c.yieldFor = 1, time.Hour })
		testkit.WaitFor(t, 10*time.Second, "a warm start", func() bool { return d.get("c001") != nil })
		if got := weights(d, "c001"); !slices.Equal(got, lowThenDefault[:1]) {
			t.Fatalf("weights of a warm start nobody waits for: %v, want %v", got, lowThenDefault[:1])
		}
		took := make(chan error, 1)
		go func() {
			sb, err := p.Acquire(t.Context(), 0)
			if err == nil {
				p.Release(t.Context(), sb, true)
			}
			took <- err
		}()
		testkit.WaitFor(t, 10*time.Second, "the start raised for the caller", func() bool {
			return slices.Equal(weights(d, "c001"), lowThenDefault)
		})
		close(d.ready)
		if err := <-took; err != nil {
			t.Fatal(err)
		}
		if got := weights(d, "c001"); !slices.Equal(got, lowThenDefault) {
			t.Errorf("weights once ready: %v, want %v", got, lowThenDefault)
		}
	})
	t.Run("a caller waits for a scrub", func(t *testing.T) {
		// One caller waits while one sandbox is being scrubbed: the
		// scrub serves it, and the start keeps yielding.
		t.Parallel()
		d := newFakeDriver()
		p := newTestPool(t, d, func(c *Config) { c.Max, c.yieldFor = 2, time.Hour })
		testkit.WaitFor(t, 10*time.Second, "a warm sandbox", func() bool { return p.Stats().Warm == 1 })
		d.mu.Lock()
		d.ready = make(chan struct{}) // the next start stays under way
		d.mu.Unlock()
		sb, err := p.Acquire(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, 10*time.Second, "a warm start beside the run, lowered", func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return len(p.low) == 1
		})
		hold := make(chan struct{})
		c := d.get(sb.ID())
		c.mu.Lock()
		c.holdReset = hold
		c.mu.Unlock()
		p.Release(t.Context(), sb, true)
		took := acquireWaiting(t, t.Context(), p, "the caller waiting")
		time.Sleep(100 * time.Millisecond) // a raise's goroutine would run by now
		if got := weights(d, "c002"); !slices.Equal(got, lowThenDefault[:1]) {
			t.Errorf("weights of the start while a scrub can serve the caller: %v, want %v", got, lowThenDefault[:1])
		}
		close(hold)
		if got := <-took; got == nil || got.ID() != sb.ID() {
			t.Errorf("the caller took %v, want the scrubbed %s", got, sb.ID())
		} else {
			p.Release(t.Context(), got, true)
		}
		if got := weights(d, "c002"); !slices.Equal(got, lowThenDefault[:1]) {
			t.Errorf("weights of the start after the scrub served the caller: %v, want %v", got, lowThenDefault[:1])
		}
		close(d.ready)
		testkit.WaitFor(t, 10*time.Second, "the start raised once ready", func() bool {
			return slices.Equal(weights(d, "c002"), lowThenDefault)
		})
	})
	t.Run("bounded", func(t *testing.T) {
		t.Parallel()
		d := newFakeDriver()
		d.ready = make(chan struct{})
		p := newTestPool(t, d, func(c *Config) { c.Max, c.yieldFor = 1, 100*time.Millisecond })
		testkit.WaitFor(t, 10*time.Second, "the start raised after yieldFor", func() bool {
			return slices.Equal(weights(d, "c001"), lowThenDefault)
		})
		close(d.ready)
		testkit.WaitFor(t, 10*time.Second, "a warm sandbox", func() bool { return p.Stats().Warm == 1 })
		if got := weights(d, "c001"); !slices.Equal(got, lowThenDefault) {
			t.Errorf("weights once ready: %v, want %v", got, lowThenDefault)
		}
	})
	t.Run("for a caller", func(t *testing.T) {
		t.Parallel()
		d := newFakeDriver()
		p := newTestPool(t, d, func(c *Config) { c.MinWarm, c.Max = 0, 1 })
		sb, err := p.Acquire(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Release(t.Context(), sb, true)
		if got := weights(d, sb.ID()); !slices.Equal(got, []int64{0}) {
			t.Errorf("weights of a start for a caller: %v, want the default (0) only", got)
		}
	})
}
