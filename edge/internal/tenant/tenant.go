// Package tenant tells which tenant a request comes from, by its API key.
//
// Keys are read once from a JSON file that maps each key to a tenant name:
//
//	{"k-3f9a...": "team-a", "k-77c1...": "team-b"}
//
// The file must be the service's own: one its group or other users may read
// or write is refused (see secretfile.Read).
//
// With no keys configured every request is the tenant Anonymous; with keys,
// every request to a door must carry one, so one edge never has both kinds
// of caller. Edges with and without keys may share a cluster, though, and
// a tenant's sessions are its name's: no key may name the tenant
// Anonymous, so that a key's holder never reaches the sessions of keyless
// callers, nor they its. A Resolver is immutable and safe for concurrent
// use.
package tenant

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/codemode-go/codemode/internal/secretfile"
)

// Anonymous is the tenant of every request when no keys are configured.
const Anonymous = "anonymous"

// ErrUnauthenticated is returned when keys are configured and the request
// carries none of them.
var ErrUnauthenticated = errors.New("missing or unknown API key: send Authorization: Bearer <key>")

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// Resolver maps API keys to tenants.
type Resolver struct {
	keys map[[sha256.Size]byte]string // sha256(key) -> tenant
}

// Load reads keys from the JSON file at path; an empty path means no keys.
// A file its group or other users may read or write is refused, with an
// error wrapping secretfile.ErrExposed that says how to fix it.
func Load(path string) (*Resolver, error) {
	if path == "" {
		return &Resolver{}, nil
	}
	b, err := secretfile.Read(path)
	if err != nil {
		return nil, fmt.Errorf("read api keys: %w", err)
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("parse api keys %s: %w", path, err)
	}
	return New(m)
}

// New returns a resolver for keys (key -> tenant). Tenant names are lower
// case letters, digits, '_', '.' and '-', at most 63 long, and not
// Anonymous; keys at least 16 bytes.
func New(keys map[string]string) (*Resolver, error) {
	r := &Resolver{keys: make(map[[sha256.Size]byte]string, len(keys))}
	for k, t := range keys {
		if len(k) < 16 {
			return nil, fmt.Errorf("api key for tenant %q is shorter than 16 bytes", t)
		}
		if !namePattern.MatchString(t) {
			return nil, fmt.Errorf("tenant name %q: want %s", t, namePattern)
		}
		if t == Anonymous {
			return nil, fmt.Errorf("tenant name %q is reserved for callers without a key (on edges without keys); give this key another tenant name", t)
		}
		r.keys[sha256.Sum256([]byte(k))] = t
	}
	return r, nil
}

// Enabled reports whether keys are configured.
func (r *Resolver) Enabled() bool { return len(r.keys) > 0 }

// Resolve returns the tenant of a request with header h.
func (r *Resolver) Resolve(h http.Header) (string, error) {
	if !r.Enabled() {
		return Anonymous, nil
	}
	key, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	if !ok || key == "" {
		return "", ErrUnauthenticated
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(key)))
	// Map lookup by digest; the comparison below keeps the check constant-time
	// in the key's bytes.
	for d, t := range r.keys {
		if subtle.ConstantTimeCompare(d[:], sum[:]) == 1 {
			return t, nil
		}
	}
	return "", ErrUnauthenticated
}

type contextKey struct{}

// NewContext returns ctx carrying tenant t.
func NewContext(ctx context.Context, t string) context.Context {
	return context.WithValue(ctx, contextKey{}, t)
}

// FromContext returns the tenant that [Resolver.Authenticate] put in ctx.
func FromContext(ctx context.Context) (string, bool) {
	t, ok := ctx.Value(contextKey{}).(string)
	return t, ok
}

// Authenticate resolves the tenant of r from its header alone (nothing reads
// the body before it) and returns r's context carrying it.
func (r *Resolver) Authenticate(req *http.Request) (context.Context, error) {
	t, err := r.Resolve(req.Header)
	if err != nil {
		return nil, err
	}
	return NewContext(req.Context(), t), nil
}

// Of returns the tenant of a request with context ctx and header h: the one
// Authenticate put in ctx, else the one h's key resolves to.
func (r *Resolver) Of(ctx context.Context, h http.Header) (string, error) {
	if t, ok := FromContext(ctx); ok {
		return t, nil
	}
	return r.Resolve(h)
}
