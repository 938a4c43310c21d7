package policy

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// pool is one module's bounded set of warm instances. An idle instance
// waits in the pool; a call takes one out and puts it back, or discards it
// when the call failed, and a goroutine then makes a replacement, so the
// pool keeps its size while the module is loaded.
//
// A pool is safe for concurrent use. [pool.close] stops replacements, waits
// for those under way and closes the idle instances; the caller makes sure
// no call is in flight (the generation's reference count does).
type pool struct {
	idle     chan *instance
	fresh    func(context.Context) (*instance, error) // makes an instance
	logger   *slog.Logger
	done     chan struct{} // closed by close: stops replacements
	replacer sync.WaitGroup
}

// newPool makes size instances with fresh. On error it closes the ones it
// made.
func newPool(ctx context.Context, size int, fresh func(context.Context) (*instance, error), logger *slog.Logger) (*pool, error) {
	p := &pool{
		idle:   make(chan *instance, size),
		fresh:  fresh,
		logger: logger,
		done:   make(chan struct{}),
	}
	for range size {
		inst, err := fresh(ctx)
		if err != nil {
			p.close(context.WithoutCancel(ctx))
			return nil, err
		}
		p.idle <- inst
	}
	return p, nil
}

// size is the number of instances the pool keeps.
func (p *pool) size() int { return cap(p.idle) }

// get takes an idle instance, waiting at most wait for one to come back or
// be replaced. It returns errUnavailable when none came in time,
// errModuleClosed when the pool closed, or the context's error.
func (p *pool) get(ctx context.Context, wait time.Duration) (*instance, error) {
	select {
	case inst := <-p.idle:
		return inst, nil
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case inst := <-p.idle:
		return inst, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.done:
		return nil, errModuleClosed
	case <-t.C:
		return nil, errUnavailable
	}
}

// put returns an instance whose call succeeded.
func (p *pool) put(inst *instance) { p.idle <- inst }

// discard closes a failed instance and makes a replacement in the background.
func (p *pool) discard(inst *instance, cause error) {
	level := slog.LevelWarn
	if errors.Is(cause, context.Canceled) {
		level = slog.LevelDebug // the caller went away; nothing is wrong
	}
	p.logger.Log(context.Background(), level, "policy instance discarded", "error", cause)
	_ = inst.mod.Close(context.Background())
	p.replacer.Add(1)
	go p.replace()
}

// replace makes a new instance for the pool, retrying with backoff until it
// succeeds or the pool closes.
func (p *pool) replace() {
	defer p.replacer.Done()
	backoff := 50 * time.Millisecond
	for {
		select {
		case <-p.done:
			return
		default:
		}
		inst, err := p.fresh(context.Background())
		if err == nil {
			select {
			case <-p.done:
				_ = inst.mod.Close(context.Background())
			default:
				p.idle <- inst
			}
			return
		}
		p.logger.Error("replace policy instance", "error", err)
		select {
		case <-p.done:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// close stops replacements, waits for those under way and closes the idle
// instances.
func (p *pool) close(ctx context.Context) {
	close(p.done)
	p.replacer.Wait()
	for {
		select {
		case inst := <-p.idle:
			_ = inst.mod.Close(ctx)
		default:
			return
		}
	}
}
