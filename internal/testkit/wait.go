package testkit

import (
	"errors"
	"testing"
	"time"
)

// The pause between two checks of a condition starts at firstPoll and
// doubles up to maxPoll: a condition met at once costs a millisecond, and
// one that takes seconds (a container starting) is asked about twenty
// times a second.
const (
	firstPoll = time.Millisecond
	maxPoll   = 50 * time.Millisecond
)

// errNotYet is what [Until] makes of a condition that does not hold.
var errNotYet = errors.New("condition not met")

// Poll calls check until it returns nil or within has passed, pausing
// between calls. It returns nil, or check's last error once within has
// passed. check runs on the calling goroutine, so it may end a test.
func Poll(within time.Duration, check func() error) error {
	deadline := time.Now().Add(within)
	pause := firstPoll
	for {
		err := check()
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return err
		}
		time.Sleep(min(pause, time.Until(deadline)))
		pause = min(2*pause, maxPoll)
	}
}

// Until calls cond until it holds or within has passed, pausing between
// calls, and reports whether it held.
func Until(within time.Duration, cond func() bool) bool {
	return Poll(within, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}) == nil
}

// Eventually fails tb unless check returns nil within the given time; the
// failure says check's last error.
func Eventually(tb testing.TB, within time.Duration, check func() error) {
	tb.Helper()
	if err := Poll(within, check); err != nil {
		tb.Fatalf("after %v: %v", within, err)
	}
}

// WaitFor fails tb unless cond holds within the given time; the failure
// names what was waited for.
func WaitFor(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Until(within, cond) {
		tb.Fatalf("timed out after %v waiting for %s", within, what)
	}
}
