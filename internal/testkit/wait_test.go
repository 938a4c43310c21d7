package testkit

import (
	"errors"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	t.Parallel()
	t.Run("met", func(t *testing.T) {
		t.Parallel()
		calls := 0
		err := Poll(time.Second, func() error {
			if calls++; calls < 3 {
				return errNotYet
			}
			return nil
		})
		if err != nil || calls != 3 {
			t.Fatalf("Poll = %v after %d calls, want nil after 3", err, calls)
		}
	})
	t.Run("until", func(t *testing.T) {
		t.Parallel()
		calls := 0
		if !Until(time.Second, func() bool { calls++; return calls == 2 }) || calls != 2 {
			t.Fatalf("Until after %d calls, want true after 2", calls)
		}
		if Until(10*time.Millisecond, func() bool { return false }) {
			t.Fatal("Until of a condition that never holds = true")
		}
	})
	t.Run("never", func(t *testing.T) {
		t.Parallel()
		last := errors.New("last")
		start := time.Now()
		err := Poll(30*time.Millisecond, func() error { return last })
		if err != last {
			t.Fatalf("Poll = %v, want the check's last error", err)
		}
		if d := time.Since(start); d < 30*time.Millisecond || d > time.Second {
			t.Fatalf("Poll gave up after %v, want 30ms", d)
		}
	})
}
