package policy

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// deadlineCtx is the context of one instance's calls: a reusable timer
// fires when a call passes its deadline. It sets the interrupt global of an
// instrumented module (whose next loop iteration traps) and closes done, on
// which wazero closes a module run WithCloseOnContextDone. This costs no
// allocation per call, where context.WithTimeout costs a timer, a context
// and a channel. Once done is closed the instance is discarded, so the
// channel never needs reopening.
//
// Cancelling the parent context fires it early (see module.call).
type deadlineCtx struct {
	context.Context // the parent, for values; set per call
	done            chan struct{}
	timer           *time.Timer
	at              time.Time
	fired           atomic.Bool
	flag            api.MutableGlobal // nil: not instrumented
}

// newDeadlineCtx returns the deadline of one instance. When it fires it
// sets flag, the interrupt global of an instrumented module, if not nil.
func newDeadlineCtx(flag api.MutableGlobal) *deadlineCtx {
	d := &deadlineCtx{done: make(chan struct{}), flag: flag}
	d.timer = time.AfterFunc(time.Hour, d.fire)
	d.timer.Stop()
	return d
}

// fire interrupts the running call, once: at the deadline, or when the
// caller's context is cancelled.
func (d *deadlineCtx) fire() {
	if !d.fired.CompareAndSwap(false, true) {
		return
	}
	if d.flag != nil {
		d.flag.Set(1)
	}
	close(d.done)
}

// noStop stands for the stop function of a context.AfterFunc that was not
// registered (the parent context cannot be cancelled).
func noStop() bool { return true }

// start arms the deadline for one call.
func (d *deadlineCtx) start(parent context.Context, timeout time.Duration) *deadlineCtx {
	d.Context = parent
	d.at = time.Now().Add(timeout)
	d.timer.Reset(timeout)
	return d
}

// stop disarms the deadline; false means it fired.
func (d *deadlineCtx) stop() bool {
	d.Context = nil
	return d.timer.Stop() && !d.fired.Load()
}

func (d *deadlineCtx) Deadline() (time.Time, bool) { return d.at, true }
func (d *deadlineCtx) Done() <-chan struct{}       { return d.done }
func (d *deadlineCtx) Err() error {
	if d.fired.Load() {
		return context.DeadlineExceeded
	}
	return nil
}
