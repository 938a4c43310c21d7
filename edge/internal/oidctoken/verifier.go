// Package oidctoken verifies OIDC/JWT bearer tokens (access tokens, RFC
// 9068) from the OpenID providers an edge is configured to trust, and says
// who a token's holder is: their tenant, a hash of their subject, and the
// rights their scopes grant.
//
// Each issuer's discovery document and keys (JWKS) are fetched when a
// token first needs them, kept, and fetched again every KeysRefresh, or
// sooner when a token names a key the edge does not hold (at most once a
// MinKeysRefresh): a provider that rotates its keys is followed without a
// restart, and a key it stops publishing stops verifying tokens once the
// edge has fetched its keys again, cached tokens included.
//
// A token is accepted only when it is a JWS with one signature, by an
// asymmetric algorithm the issuer allows (never none nor HMAC), made with
// a key the issuer publishes; its iss names a configured issuer exactly; its
// aud names one of that issuer's audiences; exp is present and not past;
// nbf and iat are not in the future, all within the configured clock skew;
// sub is present; and its tenant claim maps, through the allow-list, to
// exactly one tenant. Verified tokens are remembered (keyed by their
// SHA-256) until they expire, so a caller that sends the same token again
// costs a hash and a map look-up.
//
// A Verifier is safe for concurrent use.
package oidctoken

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Errors. Each is wrapped with what was wrong; the message is meant for
// the caller.
var (
	// ErrInvalid: the token is not one the edge accepts (malformed, bad
	// signature, expired, another issuer or audience, ...). Get another.
	ErrInvalid = errors.New("invalid bearer token")
	// ErrTenantNotAllowed: the token is valid but names no tenant this
	// edge serves (or two).
	ErrTenantNotAllowed = errors.New("token names no tenant this edge serves")
	// ErrIssuerUnavailable: the issuer's keys could not be fetched.
	ErrIssuerUnavailable = errors.New("cannot fetch the token issuer's keys")
)

// asymmetric are the signature algorithms accepted at all.
var asymmetric = []string{
	string(jose.RS256), string(jose.RS384), string(jose.RS512),
	string(jose.PS256), string(jose.PS384), string(jose.PS512),
	string(jose.ES256), string(jose.ES384), string(jose.ES512),
	string(jose.EdDSA),
}

func asymmetricAlgs() []jose.SignatureAlgorithm {
	out := make([]jose.SignatureAlgorithm, len(asymmetric))
	for i, a := range asymmetric {
		out[i] = jose.SignatureAlgorithm(a)
	}
	return out
}

// Identity is who a verified token's holder is.
type Identity struct {
	// Issuer that signed the token.
	Issuer string
	// Tenant the token's tenant claim maps to.
	Tenant string
	// Subject is a hash of the issuer and the token's sub (hex, 32
	// characters): it tells callers apart in logs and policies without
	// naming them.
	Subject string
	// Rights the token's scopes grant.
	Rights Rights
	// Expiry of the token.
	Expiry time.Time
}

// Verifier verifies tokens of the configured issuers.
type Verifier struct {
	issuers map[string]*issuer
	skew    time.Duration
	cache   *cache
	now     func() time.Time
}

// Option configures a Verifier.
type Option func(*Verifier)

// WithClock makes the Verifier read the time from now (tests).
func WithClock(now func() time.Time) Option {
	return func(v *Verifier) { v.now = now }
}

// New returns a Verifier of cfg's issuers that fetches their documents and
// keys with client. Nothing is fetched before a token needs it.
func New(cfg Config, client *http.Client, logger *slog.Logger, opts ...Option) (*Verifier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	v := &Verifier{issuers: map[string]*issuer{}, skew: time.Duration(cfg.ClockSkew), now: time.Now}
	if cfg.ClockSkew == 0 {
		v.skew = DefaultClockSkew
	}
	size := cfg.CacheSize
	if size == 0 {
		size = DefaultCacheSize
	}
	v.cache = newCache(size)
	for _, o := range opts {
		o(v)
	}
	for _, c := range cfg.Issuers {
		is := &issuer{cfg: c, client: client, logger: logger.With("issuer", c.Issuer), scopes: map[string]Rights{},
			refresh: time.Duration(c.KeysRefresh), minRefresh: time.Duration(c.MinKeysRefresh)}
		if is.refresh == 0 {
			is.refresh = DefaultKeysRefresh
		}
		if is.minRefresh == 0 {
			is.minRefresh = DefaultMinKeysRefresh
		}
		scopes := c.Scopes
		if len(scopes) == 0 {
			scopes = defaultScopes
		}
		for s, names := range scopes {
			is.scopes[s], _ = parseRights(names) // validated
		}
		v.issuers[c.Issuer] = is
	}
	return v, nil
}

// Issuers returns the configured issuers' URLs.
func (v *Verifier) Issuers() []string {
	var out []string
	for u := range v.issuers {
		out = append(out, u)
	}
	slices.Sort(out)
	return out
}

// Verify verifies raw and returns its holder's identity. Errors wrap
// ErrInvalid, ErrTenantNotAllowed or ErrIssuerUnavailable.
func (v *Verifier) Verify(ctx context.Context, raw string) (Identity, error) {
	now := v.now()
	sum := sha256.Sum256([]byte(raw))
	if e, ok := v.cache.get(sum); ok {
		if !now.Before(e.id.Expiry.Add(v.skew)) {
			v.cache.remove(sum)
			return Identity{}, fmt.Errorf("%w: expired", ErrInvalid)
		}
		if ks := e.iss.keys.Load(); ks != nil && now.Sub(ks.fetched) < e.iss.refresh {
			if _, ok := ks.byID[e.kid]; ok {
				return e.id, nil
			}
		}
		v.cache.remove(sum) // the keys moved on: verify afresh
	}
	id, is, kid, err := v.verify(ctx, raw, now)
	if err != nil {
		return Identity{}, err
	}
	v.cache.put(sum, entry{id: id, iss: is, kid: kid}, now, v.skew)
	return id, nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

func (v *Verifier) verify(ctx context.Context, raw string, now time.Time) (Identity, *issuer, string, error) {
	tok, err := jwt.ParseSigned(raw, asymmetricAlgs())
	if err != nil {
		return Identity{}, nil, "", invalid("not a JWT signed with an asymmetric algorithm")
	}
	if len(tok.Headers) != 1 {
		return Identity{}, nil, "", invalid("want exactly one signature")
	}
	h := tok.Headers[0]
	var unverified struct {
		Issuer string `json:"iss"`
	}
	if err := tok.UnsafeClaimsWithoutVerification(&unverified); err != nil {
		return Identity{}, nil, "", invalid("claims are not JSON")
	}
	is, ok := v.issuers[unverified.Issuer]
	if !ok {
		return Identity{}, nil, "", invalid("its issuer is not trusted here")
	}
	ks, err := is.keySet(ctx, now, false)
	if err != nil {
		return Identity{}, nil, "", err
	}
	if !slices.Contains(ks.algs, jose.SignatureAlgorithm(h.Algorithm)) {
		return Identity{}, nil, "", invalid("algorithm %s is not one issuer %s signs with", h.Algorithm, is.cfg.Issuer)
	}
	key, ok := ks.find(h.KeyID, h.Algorithm)
	if !ok {
		if ks, err = is.keySet(ctx, now, true); err != nil {
			return Identity{}, nil, "", err
		}
		if key, ok = ks.find(h.KeyID, h.Algorithm); !ok {
			return Identity{}, nil, "", invalid("signed with a key issuer %s does not publish", is.cfg.Issuer)
		}
	}
	var claims jwt.Claims
	var extra map[string]any
	if err := tok.Claims(key.Key, &claims, &extra); err != nil {
		return Identity{}, nil, "", invalid("bad signature")
	}
	if claims.Expiry == nil {
		return Identity{}, nil, "", invalid("no exp")
	}
	if claims.Subject == "" {
		return Identity{}, nil, "", invalid("no sub")
	}
	if err := claims.ValidateWithLeeway(jwt.Expected{Issuer: is.cfg.Issuer, AnyAudience: is.cfg.Audiences, Time: now}, v.skew); err != nil {
		switch {
		case errors.Is(err, jwt.ErrInvalidAudience):
			return Identity{}, nil, "", invalid("audience is not this edge (want one of %s)", strings.Join(is.cfg.Audiences, ", "))
		case errors.Is(err, jwt.ErrExpired):
			return Identity{}, nil, "", invalid("expired")
		case errors.Is(err, jwt.ErrNotValidYet), errors.Is(err, jwt.ErrIssuedInTheFuture):
			return Identity{}, nil, "", invalid("not valid yet")
		}
		return Identity{}, nil, "", invalid("claims: %v", err)
	}
	tenant, err := is.tenant(extra[is.cfg.TenantClaim])
	if err != nil {
		return Identity{}, nil, "", err
	}
	sub := sha256.Sum256([]byte(is.cfg.Issuer + "\x00" + claims.Subject))
	id := Identity{Issuer: is.cfg.Issuer, Tenant: tenant, Subject: hex.EncodeToString(sub[:16]),
		Rights: is.rights(extra), Expiry: claims.Expiry.Time()}
	return id, is, key.KeyID, nil
}

// strings returns a claim that is a string or an array of strings.
func claimStrings(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []any:
		var out []string
		for _, e := range v {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

func (is *issuer) tenant(claim any) (string, error) {
	t := ""
	for _, v := range claimStrings(claim) {
		name, ok := is.cfg.Tenants[v]
		if !ok {
			continue
		}
		if t != "" && t != name {
			return "", fmt.Errorf("%w: claim %s maps to both %s and %s", ErrTenantNotAllowed, is.cfg.TenantClaim, t, name)
		}
		t = name
	}
	if t == "" {
		return "", fmt.Errorf("%w: claim %s has no value this edge maps to a tenant", ErrTenantNotAllowed, is.cfg.TenantClaim)
	}
	return t, nil
}

// rights returns what the token's scope (space-separated) and scp (a
// string or an array) claims grant.
func (is *issuer) rights(claims map[string]any) Rights {
	var scopes []string
	if s, ok := claims["scope"].(string); ok {
		scopes = strings.Fields(s)
	}
	for _, s := range claimStrings(claims["scp"]) {
		scopes = append(scopes, strings.Fields(s)...)
	}
	var rs Rights
	for _, s := range scopes {
		rs |= is.scopes[s]
	}
	return rs
}

// issuer is one trusted OpenID provider and its keys.
type issuer struct {
	cfg        Issuer
	client     *http.Client
	logger     *slog.Logger
	scopes     map[string]Rights
	refresh    time.Duration
	minRefresh time.Duration

	keys atomic.Pointer[keySet] // nil until first fetched

	mu       sync.Mutex // serialises fetches; guards what follows
	jwksURI  string     // from discovery
	algs     []jose.SignatureAlgorithm
	authURL  string    // authorization_endpoint, from discovery
	tokenURL string    // token_endpoint, from discovery
	lastTry  time.Time // of the last fetch, failed or not
	lastFail error
}

// keySet is an issuer's keys as fetched at one time.
type keySet struct {
	byID    map[string]jose.JSONWebKey
	algs    []jose.SignatureAlgorithm
	fetched time.Time
}

// find returns the key with id kid for alg. A token without kid may use
// the issuer's only key.
func (ks *keySet) find(kid string, alg string) (jose.JSONWebKey, bool) {
	k, ok := ks.byID[kid]
	if !ok && kid == "" && len(ks.byID) == 1 {
		for _, only := range ks.byID {
			k, ok = only, true
		}
	}
	if !ok || (k.Algorithm != "" && k.Algorithm != alg) || !keyFits(k.Key, alg) {
		return jose.JSONWebKey{}, false
	}
	return k, true
}

// keyFits reports whether key is a public key of the type alg signs with.
func keyFits(key any, alg string) bool {
	switch key.(type) {
	case *rsa.PublicKey:
		return strings.HasPrefix(alg, "RS") || strings.HasPrefix(alg, "PS")
	case *ecdsa.PublicKey:
		return strings.HasPrefix(alg, "ES")
	case ed25519.PublicKey:
		return alg == string(jose.EdDSA)
	}
	return false
}

// keySet returns the issuer's keys, fetching them when there are none,
// when they are older than refresh, or, with unknownKey, when a token
// named a key they lack and the last fetch is at least minRefresh old.
func (is *issuer) keySet(ctx context.Context, now time.Time, unknownKey bool) (*keySet, error) {
	ks := is.keys.Load()
	if ks != nil && now.Sub(ks.fetched) < is.refresh && !unknownKey {
		return ks, nil
	}
	is.mu.Lock()
	defer is.mu.Unlock()
	if cur := is.keys.Load(); cur != ks && cur != nil {
		return cur, nil // another caller fetched meanwhile
	}
	if !is.lastTry.IsZero() && now.Sub(is.lastTry) < is.minRefresh {
		if ks != nil {
			return ks, nil
		}
		return nil, fmt.Errorf("%w: %w", ErrIssuerUnavailable, is.lastFail)
	}
	is.lastTry = now
	fresh, err := is.fetch(ctx, now)
	if err != nil {
		is.lastFail = err
		is.logger.Warn("fetch issuer keys", "error", err)
		if ks != nil {
			return ks, nil // keep serving with the keys held
		}
		return nil, fmt.Errorf("%w: %w", ErrIssuerUnavailable, err)
	}
	is.keys.Store(fresh)
	return fresh, nil
}

// maxDocumentBytes bounds the discovery document and the key set.
const maxDocumentBytes = 1 << 20

func (is *issuer) getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	res, err := is.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return fmt.Errorf("get %s: %s", url, res.Status)
	}
	b, err := io.ReadAll(io.LimitReader(res.Body, maxDocumentBytes+1))
	if err != nil {
		return fmt.Errorf("get %s: %w", url, err)
	}
	if len(b) > maxDocumentBytes {
		return fmt.Errorf("get %s: over %d bytes", url, maxDocumentBytes)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("parse %s: %w", url, err)
	}
	return nil
}

// fetch reads the discovery document (once) and the key set. Called with
// is.mu held.
func (is *issuer) fetch(ctx context.Context, now time.Time) (*keySet, error) {
	if is.jwksURI == "" {
		var doc struct {
			Issuer  string   `json:"issuer"`
			JWKSURI string   `json:"jwks_uri"`
			Algs    []string `json:"id_token_signing_alg_values_supported"`
			Auth    string   `json:"authorization_endpoint"`
			Token   string   `json:"token_endpoint"`
		}
		if err := is.getJSON(ctx, strings.TrimRight(is.cfg.Issuer, "/")+"/.well-known/openid-configuration", &doc); err != nil {
			return nil, fmt.Errorf("discover: %w", err)
		}
		if doc.Issuer != is.cfg.Issuer {
			return nil, fmt.Errorf("discover: the document names issuer %q", doc.Issuer)
		}
		if doc.JWKSURI == "" {
			return nil, errors.New("discover: no jwks_uri")
		}
		allowed := is.cfg.Algorithms
		if len(allowed) == 0 {
			allowed = doc.Algs
		}
		if len(allowed) == 0 {
			allowed = []string{string(jose.RS256)} // OpenID Connect Discovery's default
		}
		var algs []jose.SignatureAlgorithm
		for _, a := range allowed {
			if slices.Contains(asymmetric, a) {
				algs = append(algs, jose.SignatureAlgorithm(a))
			}
		}
		if len(algs) == 0 {
			return nil, fmt.Errorf("discover: the issuer signs with no asymmetric algorithm (lists %s)", strings.Join(allowed, ", "))
		}
		is.jwksURI, is.algs, is.authURL, is.tokenURL = doc.JWKSURI, algs, doc.Auth, doc.Token
	}
	var set jose.JSONWebKeySet
	if err := is.getJSON(ctx, is.jwksURI, &set); err != nil {
		return nil, fmt.Errorf("keys: %w", err)
	}
	ks := &keySet{byID: map[string]jose.JSONWebKey{}, algs: is.algs, fetched: now}
	for _, k := range set.Keys {
		if !k.Valid() || !k.IsPublic() || (k.Use != "" && k.Use != "sig") {
			continue // symmetric, private or encryption keys never verify
		}
		if _, dup := ks.byID[k.KeyID]; dup {
			continue
		}
		ks.byID[k.KeyID] = k
	}
	if len(ks.byID) == 0 {
		return nil, errors.New("keys: the issuer publishes no public signing key")
	}
	return ks, nil
}

// Scopes returns the scopes that grant rights, over every issuer.
func (v *Verifier) Scopes() []string {
	var out []string
	for _, is := range v.issuers {
		for s := range is.scopes {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// SignIn is what a web page needs to sign a user in with the authorization
// code flow and PKCE: the issuer's endpoints, its client id and the
// scopes to ask for.
type SignIn struct {
	Issuer                string   `json:"issuer"`
	ClientID              string   `json:"clientId"`
	AuthorizationEndpoint string   `json:"authorizationEndpoint"`
	TokenEndpoint         string   `json:"tokenEndpoint"`
	Scopes                []string `json:"scopes"`
}

// SignIn returns the playground's sign-in settings: those of the issuer
// with a PlaygroundClientID, whose discovery document it fetches if it has
// not yet. ok is false when no issuer has one.
func (v *Verifier) SignIn(ctx context.Context) (s SignIn, ok bool, err error) {
	for _, is := range v.issuers {
		if is.cfg.PlaygroundClientID == "" {
			continue
		}
		if _, err := is.keySet(ctx, v.now(), false); err != nil {
			return SignIn{}, true, err
		}
		is.mu.Lock()
		defer is.mu.Unlock()
		if is.authURL == "" || is.tokenURL == "" {
			return SignIn{}, true, fmt.Errorf("%w: its discovery document names no authorization or token endpoint", ErrIssuerUnavailable)
		}
		scopes := []string{"openid"}
		for sc := range is.scopes {
			scopes = append(scopes, sc)
		}
		slices.Sort(scopes[1:])
		return SignIn{Issuer: is.cfg.Issuer, ClientID: is.cfg.PlaygroundClientID, AuthorizationEndpoint: is.authURL,
			TokenEndpoint: is.tokenURL, Scopes: scopes}, true, nil
	}
	return SignIn{}, false, nil
}
