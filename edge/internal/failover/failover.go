// Package failover lets the edge use several control planes: its HTTP
// transport sends each call to the first of them that takes it, starting
// from the one that last did, and keeps to it while it answers.
//
// A call moves to the next control plane only when it certainly has not
// started: the connection to the one tried could not be dialed (no byte of
// the call was written), or that control plane answered that it did not
// start the call and another may ([cluster.MarkNotStarted], as a control
// plane does that cannot reach the session store). A call on a
// connection that breaks afterwards fails (unavailable), since the run may
// have started; the next call dials again and reaches the next control
// plane that accepts. Runs, streams, sessions and files all follow these
// rules, so none runs twice.
//
// Each control plane is reached at its own URL, so that over TLS each is
// checked against its own name.
package failover

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync"

	"github.com/codemode-go/codemode/internal/cluster"
)

// drainLimit bounds what is read of a refusal before its connection is
// given back for the next call.
const drainLimit = 64 << 10

// Transport sends each request to the first of its control planes that
// takes it. Safe for concurrent use.
type Transport struct {
	targets []*url.URL // scheme and host of each control plane
	base    http.RoundTripper
	logger  *slog.Logger

	mu   sync.Mutex
	next int // index of the control plane that last took a call
}

// New returns a Transport over the control planes at urls (base URLs:
// scheme and host), trying them in order from the first, each through base.
// Requests may name any host: their scheme and host are replaced by the
// chosen control plane's.
func New(urls []string, base http.RoundTripper, logger *slog.Logger) (*Transport, error) {
	if len(urls) == 0 {
		return nil, errors.New("failover: no control plane")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	t := &Transport{base: base, logger: logger}
	for _, s := range urls {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("failover: control plane %q is not an http or https URL", s)
		}
		t.targets = append(t.targets, &url.URL{Scheme: u.Scheme, Host: u.Host})
	}
	return t, nil
}

// RoundTrip implements http.RoundTripper. It fails, joining every error,
// when no control plane can be dialed; a control plane's answer, even a
// refusal, is returned when it is the last one left or the request's body
// cannot be sent again.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.mu.Lock()
	start := t.next
	t.mu.Unlock()
	var errs []error
	for i := range t.targets {
		k := (start + i) % len(t.targets)
		r, err := t.retarget(req, k, i > 0)
		if err != nil {
			return nil, errors.Join(append(errs, err)...)
		}
		last := i == len(t.targets)-1
		res, err := t.base.RoundTrip(r)
		switch {
		case err != nil && (last || !cluster.NotStarted(err) || req.Context().Err() != nil):
			return nil, errors.Join(append(errs, fmt.Errorf("%s: %w", t.targets[k].Host, err))...)
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", t.targets[k].Host, err))
			t.logger.Warn("control plane unreachable; trying the next", "unreachable", t.targets[k].Host, "error", err)
			continue
		case last || res.Header.Get(cluster.NotStartedHeader) == "" || !replayable(req):
			if i > 0 {
				t.logger.Warn("using the next control plane", "using", t.targets[k].Host)
			}
			t.mu.Lock()
			t.next = k
			t.mu.Unlock()
			return res, nil
		}
		t.logger.Warn("control plane did not start the call; trying the next", "control_plane", t.targets[k].Host,
			"reason", res.Header.Get(cluster.NotStartedHeader))
		_, _ = io.CopyN(io.Discard, res.Body, drainLimit)
		res.Body.Close()
		errs = append(errs, fmt.Errorf("%s: did not start the call", t.targets[k].Host))
	}
	panic("unreachable") // the last target always returns
}

// retarget returns req sent to target k; again says req was sent before,
// so its body must be read anew.
func (t *Transport) retarget(req *http.Request, k int, again bool) (*http.Request, error) {
	r := req.Clone(req.Context())
	r.URL.Scheme, r.URL.Host = t.targets[k].Scheme, t.targets[k].Host
	r.Host = ""
	if again && req.Body != nil && req.Body != http.NoBody {
		body, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("send the call again: %w", err)
		}
		r.Body = body
	}
	return r, nil
}

// replayable reports whether req's body can be sent again.
func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}
