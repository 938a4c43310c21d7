// Package failover lets the edge use several control planes: its HTTP
// client dials the first of them that accepts a connection, starting from
// the one that last did, and keeps to it while it answers.
//
// Moving on only when a dial fails means a call moves to another control
// plane only when it certainly has not started: no byte of it was written.
// A call on a connection that breaks afterwards fails (unavailable), since
// the run may have started; the next call dials again and reaches the next
// control plane that accepts. Runs, streams, sessions and files all follow
// this one rule, so none runs twice.
package failover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
)

// DialFunc dials one address.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Dialer dials the first of its addresses that accepts. Safe for
// concurrent use.
type Dialer struct {
	addrs  []string
	dial   DialFunc
	logger *slog.Logger

	mu   sync.Mutex
	next int // index of the address that last accepted
}

// New returns a Dialer over addrs (host:port), trying them in order from the
// first, each with dial.
func New(addrs []string, dial DialFunc, logger *slog.Logger) *Dialer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Dialer{addrs: addrs, dial: dial, logger: logger}
}

// DialContext ignores addr, the one the client asked for, and returns a
// connection to the first of d's addresses that accepts one, starting from
// the last that did. It fails, joining every error, when none does.
func (d *Dialer) DialContext(ctx context.Context, network, _ string) (net.Conn, error) {
	d.mu.Lock()
	start := d.next
	d.mu.Unlock()
	var errs []error
	for i := range d.addrs {
		k := (start + i) % len(d.addrs)
		c, err := d.dial(ctx, network, d.addrs[k])
		if err == nil {
			if i > 0 {
				d.logger.Warn("control plane unreachable; using the next", "unreachable", d.addrs[start], "using", d.addrs[k])
			}
			d.mu.Lock()
			d.next = k
			d.mu.Unlock()
			return c, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", d.addrs[k], err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("no control plane accepts a connection: %w", errors.Join(errs...))
}
