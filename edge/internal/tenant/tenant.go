// Package tenant tells which tenant a request comes from, by its API key
// or by an OIDC/JWT bearer token from a trusted issuer (see oidctoken).
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
//
// Keys and tokens are both sent as Authorization: Bearer; a bearer that is
// a configured key is that key's tenant, with every right; any other is
// verified as a token, when issuers are configured, and is the tenant its
// claim maps to, with the rights its scopes grant. A token's tenant is a
// tenant like a key's: a key and a token naming the same tenant share its
// sessions and limits.
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

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/edge/internal/oidctoken"
	"github.com/codemode-go/codemode/internal/secretfile"
)

// Anonymous is the tenant of every request when no keys are configured.
const Anonymous = "anonymous"

// ErrUnauthenticated is returned when keys are configured and the request
// carries none of them.
var ErrUnauthenticated = errors.New("missing or unknown API key: send Authorization: Bearer <key>")

// Identity is who a request comes from.
type Identity struct {
	// Tenant of the request.
	Tenant string
	// Subject is a hash of the token's issuer and subject (see
	// oidctoken.Identity); "" for API keys and keyless edges.
	Subject string
	// Rights the caller holds: every one for an API key or a keyless edge.
	Rights oidctoken.Rights
}

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// Resolver maps API keys to tenants.
type Resolver struct {
	keys   map[[sha256.Size]byte]string // sha256(key) -> tenant
	tokens *oidctoken.Verifier          // nil: no issuers
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

// WithTokens returns a resolver with r's keys that also accepts the tokens
// v verifies; nil v: keys only. Tenant names v maps claims to must be valid
// and not Anonymous.
func (r *Resolver) WithTokens(v *oidctoken.Verifier, cfg oidctoken.Config) (*Resolver, error) {
	for _, t := range cfg.TenantNames() {
		if !namePattern.MatchString(t) {
			return nil, fmt.Errorf("oidc tenant name %q: want %s", t, namePattern)
		}
		if t == Anonymous {
			return nil, fmt.Errorf("oidc tenant name %q is reserved for callers without a key (on edges without keys); map the claim to another tenant name", t)
		}
	}
	return &Resolver{keys: r.keys, tokens: v}, nil
}

// Enabled reports whether keys or token issuers are configured.
func (r *Resolver) Enabled() bool { return len(r.keys) > 0 || r.tokens != nil }

// Tokens returns the token verifier; nil: no issuers.
func (r *Resolver) Tokens() *oidctoken.Verifier { return r.tokens }

// Resolve returns the tenant of a request with header h.
func (r *Resolver) Resolve(h http.Header) (string, error) {
	id, err := r.Identify(context.Background(), h)
	return id.Tenant, err
}

// Identify returns who sends a request with header h. Errors: ErrUnauthenticated
// when h has no bearer, or one that is neither a key nor a token; errors of
// oidctoken.Verifier.Verify for a token it refuses (see Code).
func (r *Resolver) Identify(ctx context.Context, h http.Header) (Identity, error) {
	if !r.Enabled() {
		return Identity{Tenant: Anonymous, Rights: oidctoken.AllRights}, nil
	}
	bearer, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	bearer = strings.TrimSpace(bearer)
	if !ok || bearer == "" {
		return Identity{}, ErrUnauthenticated
	}
	sum := sha256.Sum256([]byte(bearer))
	// Map lookup by digest; the comparison below keeps the check constant-time
	// in the key's bytes.
	for d, t := range r.keys {
		if subtle.ConstantTimeCompare(d[:], sum[:]) == 1 {
			return Identity{Tenant: t, Rights: oidctoken.AllRights}, nil
		}
	}
	if r.tokens == nil || strings.Count(bearer, ".") != 2 {
		return Identity{}, ErrUnauthenticated
	}
	id, err := r.tokens.Verify(ctx, bearer)
	if err != nil {
		return Identity{}, err
	}
	return Identity{Tenant: id.Tenant, Subject: id.Subject, Rights: id.Rights}, nil
}

// Code is the code a door answers err of Identify with: unauthenticated
// for a missing or bad credential, permission_denied for a valid token
// whose tenant this edge does not serve, unavailable when the issuer's keys
// cannot be had.
func Code(err error) connect.Code {
	switch {
	case errors.Is(err, oidctoken.ErrTenantNotAllowed):
		return connect.CodePermissionDenied
	case errors.Is(err, oidctoken.ErrIssuerUnavailable):
		return connect.CodeUnavailable
	}
	return connect.CodeUnauthenticated
}

type contextKey struct{}

// NewContext returns ctx carrying tenant t, with every right.
func NewContext(ctx context.Context, t string) context.Context {
	return NewIdentityContext(ctx, Identity{Tenant: t, Rights: oidctoken.AllRights})
}

// NewIdentityContext returns ctx carrying id.
func NewIdentityContext(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, contextKey{}, id)
}

// FromContext returns the tenant that [Resolver.Authenticate] put in ctx.
func FromContext(ctx context.Context) (string, bool) {
	id, ok := IdentityFromContext(ctx)
	return id.Tenant, ok
}

// IdentityFromContext returns the identity that [Resolver.Authenticate]
// put in ctx.
func IdentityFromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(contextKey{}).(Identity)
	return id, ok
}

// Authenticate resolves the identity of r from its header alone (nothing
// reads the body before it) and returns r's context carrying it.
func (r *Resolver) Authenticate(req *http.Request) (context.Context, error) {
	id, err := r.Identify(req.Context(), req.Header)
	if err != nil {
		return nil, err
	}
	return NewIdentityContext(req.Context(), id), nil
}

// Of returns the tenant of a request with context ctx and header h: the one
// Authenticate put in ctx, else the one h's credential resolves to.
func (r *Resolver) Of(ctx context.Context, h http.Header) (string, error) {
	if t, ok := FromContext(ctx); ok {
		return t, nil
	}
	id, err := r.Identify(ctx, h)
	return id.Tenant, err
}

// Require returns nil when id holds want, else a permission_denied error
// whose WWW-Authenticate challenge says insufficient_scope and names the
// scope that grants want (RFC 6750 section 3.1).
func Require(id Identity, want oidctoken.Rights) error {
	if id.Rights.Has(want) {
		return nil
	}
	err := connect.NewError(connect.CodePermissionDenied, fmt.Errorf("insufficient scope: this call needs %s", want.Scope()))
	err.Meta().Set("WWW-Authenticate", fmt.Sprintf(`Bearer error="insufficient_scope", scope=%q, error_description="this call needs %s"`, want.Scope(), want.Scope()))
	return err
}
