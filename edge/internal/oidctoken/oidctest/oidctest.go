// Package oidctest runs a real OpenID provider (zitadel/oidc's op package)
// on a loopback port, for tests of the edge's token verification: it
// serves discovery, its keys (JWKS), the token endpoint, and the
// authorization endpoint with a login that signs a user in without asking,
// so that clients can be driven headlessly.
//
// Tokens are JWT access tokens. What they say is set per client: a test
// registers a client with the audience, tenant claim, subject and lifetime
// it wants, then gets a token for it through the provider's token endpoint
// (client credentials) or through the authorization code flow. The
// provider's signing key can be rotated while it runs.
package oidctest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// Client is what a client's tokens say.
type Client struct {
	// ID and Secret of the client (client credentials). ID is set by
	// Register when empty.
	ID, Secret string
	// Subject of its tokens; empty: ID.
	Subject string
	// Audience of its tokens; empty: ID. In the authorization code flow a
	// resource parameter (RFC 8707) replaces it.
	Audience []string
	// Claims added to its tokens (a tenant claim).
	Claims map[string]any
	// TTL of its tokens; zero: 5 minutes; negative: already expired when
	// issued.
	TTL time.Duration
	// RedirectURIs for the authorization code flow; a redirect URI on
	// loopback with any port is accepted.
	RedirectURIs []string
}

// Provider is a running OpenID provider.
type Provider struct {
	// Issuer is its URL (http://127.0.0.1:PORT).
	Issuer string
	store  *store
	srv    *http.Server
}

// Start runs a provider on 127.0.0.1 until t ends.
func Start(t testing.TB) *Provider {
	t.Helper()
	p, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// New runs a provider on 127.0.0.1 until Close.
func New() (*Provider, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	issuer := "http://" + ln.Addr().String()
	s := &store{Storage: storage.NewStorage(storage.NewUserStore(issuer)), clients: map[string]*Client{},
		pending: map[string][]string{}, audiences: map[string][]string{}}
	s.rotate()
	cfg := &op.Config{CryptoKey: sha256.Sum256([]byte(issuer)), CodeMethodS256: true, AuthMethodPost: true}
	p, err := op.NewProvider(cfg, s, op.StaticIssuer(issuer), op.WithAllowInsecure())
	if err != nil {
		ln.Close()
		return nil, err
	}
	callback := op.AuthCallbackURL(p)
	user := storage.NewUserStore(issuer).GetUserByID("id1").Username
	mux := http.NewServeMux()
	// The login every authorization request is sent to: it signs in the
	// provider's first user at once and goes back to the provider.
	mux.HandleFunc("/login", func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("authRequestID")
		if err := s.Storage.CheckUsernamePassword(user, "verysecure", id); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		http.Redirect(w, r, callback(r.Context(), id), http.StatusFound)
	})
	// The authorization endpoint, remembering the resource indicators
	// (RFC 8707) of each request: its tokens are for them.
	mux.Handle("/authorize", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if res := r.URL.Query()["resource"]; len(res) > 0 {
			s.mu.Lock()
			s.pending[r.URL.Query().Get("client_id")+"\x00"+r.URL.Query().Get("state")] = res
			s.mu.Unlock()
		}
		p.ServeHTTP(w, r)
	}))
	mux.Handle("/", p)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return &Provider{Issuer: issuer, store: s, srv: srv}, nil
}

// Close stops the provider.
func (p *Provider) Close() { p.srv.Close() }

// Register adds c (its ID made up when empty) and returns it.
func (p *Provider) Register(c Client) Client {
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	if c.ID == "" {
		c.ID = fmt.Sprintf("client-%d", len(p.store.clients)+1)
	}
	if c.Secret == "" {
		c.Secret = "secret-" + c.ID
	}
	cc := c
	p.store.clients[c.ID] = &cc
	return c
}

// Token gets a token for client c with scopes, from the token endpoint
// (client credentials grant).
func (p *Provider) Token(t testing.TB, c Client, scopes ...string) string {
	t.Helper()
	form := url.Values{"grant_type": {"client_credentials"}, "client_id": {c.ID}, "client_secret": {c.Secret}, "scope": {strings.Join(scopes, " ")}}
	res, err := http.PostForm(p.Issuer+"/oauth/token", form)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body struct {
		AccessToken string `json:"access_token"`
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil || body.AccessToken == "" {
		t.Fatalf("token for %s: %s %v %s %s", c.ID, res.Status, err, body.Error, body.Description)
	}
	return body.AccessToken
}

// Rotate replaces the provider's signing key: tokens it issues next are
// signed with a new key, and its key set (JWKS) lists only that key.
func (p *Provider) Rotate() { p.store.rotate() }

// KeyID is the id of the current signing key.
func (p *Provider) KeyID() string {
	p.store.mu.Lock()
	defer p.store.mu.Unlock()
	return p.store.kid
}

// store is the example in-memory storage, with clients and keys of the
// test's choosing.
type store struct {
	*storage.Storage

	mu        sync.Mutex
	key       *rsa.PrivateKey
	kid       string
	clients   map[string]*Client
	pending   map[string][]string // client id, state -> resource indicators
	audiences map[string][]string // auth request id -> resource indicators
}

func (s *store) rotate() {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key = key
	s.kid = fmt.Sprintf("key-%x", key.PublicKey.N.Bytes()[:6])
}

func (s *store) client(id string) (*Client, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[id]
	return c, ok
}

type signingKey struct {
	id  string
	key *rsa.PrivateKey
}

func (k signingKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k signingKey) Key() any                                    { return k.key }
func (k signingKey) ID() string                                  { return k.id }

type publicKey struct{ signingKey }

func (k publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return &k.key.PublicKey }

func (s *store) SigningKey(context.Context) (op.SigningKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return signingKey{id: s.kid, key: s.key}, nil
}

func (s *store) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *store) KeySet(context.Context) ([]op.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return []op.Key{publicKey{signingKey{id: s.kid, key: s.key}}}, nil
}

// opClient is a registered Client as the provider sees it.
type opClient struct {
	op.Client
	c *Client
}

func (c opClient) AccessTokenType() op.AccessTokenType { return op.AccessTokenTypeJWT }
func (c opClient) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c opClient) IsScopeAllowed(string) bool { return true }
func (c opClient) GrantTypes() []oidc.GrantType {
	return []oidc.GrantType{oidc.GrantTypeClientCredentials, oidc.GrantTypeCode}
}
func (c opClient) LoginURL(id string) string { return "/login?authRequestID=" + id }
func (c opClient) RedirectURIs() []string    { return c.c.RedirectURIs }
func (c opClient) DevMode() bool             { return true }

func (s *store) wrap(c *Client) op.Client {
	base := storage.NativeClient(c.ID, c.RedirectURIs...)
	return opClient{Client: base, c: c}
}

func (s *store) ClientCredentials(_ context.Context, id, secret string) (op.Client, error) {
	c, ok := s.client(id)
	if !ok || c.Secret != secret {
		return nil, fmt.Errorf("wrong client or secret")
	}
	return s.wrap(c), nil
}

func (s *store) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	c, ok := s.client(id)
	if !ok {
		return nil, fmt.Errorf("no client %s", id)
	}
	return s.wrap(c), nil
}

func (s *store) AuthorizeClientIDSecret(_ context.Context, id, secret string) error {
	c, ok := s.client(id)
	if !ok || c.Secret != secret {
		return fmt.Errorf("wrong client or secret")
	}
	return nil
}

func (s *store) ClientCredentialsTokenRequest(_ context.Context, id string, scopes []string) (op.TokenRequest, error) {
	c, ok := s.client(id)
	if !ok {
		return nil, fmt.Errorf("no client %s", id)
	}
	return &oidc.JWTTokenRequest{Subject: subjectOf(c), Audience: audienceOf(c), Scopes: scopes}, nil
}

func subjectOf(c *Client) string {
	if c.Subject != "" {
		return c.Subject
	}
	return c.ID
}

func audienceOf(c *Client) []string {
	if len(c.Audience) > 0 {
		return c.Audience
	}
	return []string{c.ID}
}

// CreateAuthRequest records the request's resource indicators as the
// audience of its tokens.
func (s *store) CreateAuthRequest(ctx context.Context, req *oidc.AuthRequest, userID string) (op.AuthRequest, error) {
	ar, err := s.Storage.CreateAuthRequest(ctx, req, userID)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := req.ClientID + "\x00" + req.State
	if res, ok := s.pending[key]; ok {
		s.audiences[ar.GetID()] = res
		delete(s.pending, key)
	}
	return ar, nil
}

// authRequest is an authorization request whose tokens are for the
// resources it named.
type authRequest struct {
	*storage.AuthRequest
	audience []string
}

func (a authRequest) GetAudience() []string { return a.audience }

func (s *store) withAudience(ar op.AuthRequest, err error) (op.AuthRequest, error) {
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if aud, ok := s.audiences[ar.GetID()]; ok {
		return authRequest{AuthRequest: ar.(*storage.AuthRequest), audience: aud}, nil
	}
	return ar, nil
}

func (s *store) AuthRequestByID(ctx context.Context, id string) (op.AuthRequest, error) {
	return s.withAudience(s.Storage.AuthRequestByID(ctx, id))
}

func (s *store) AuthRequestByCode(ctx context.Context, code string) (op.AuthRequest, error) {
	return s.withAudience(s.Storage.AuthRequestByCode(ctx, code))
}

// clientOf returns the client a token request is for.
func (s *store) clientOf(req op.TokenRequest) (*Client, bool) {
	switch r := req.(type) {
	case authRequest:
		return s.client(r.ApplicationID)
	case *storage.AuthRequest:
		return s.client(r.ApplicationID)
	case *oidc.JWTTokenRequest:
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, c := range s.clients {
			if subjectOf(c) == r.Subject && slicesEqual(audienceOf(c), r.Audience) {
				return c, true
			}
		}
	}
	return nil, false
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (s *store) CreateAccessToken(ctx context.Context, req op.TokenRequest) (string, time.Time, error) {
	id, exp, err := s.Storage.CreateAccessToken(ctx, req)
	if c, ok := s.clientOf(req); ok && c.TTL != 0 {
		exp = time.Now().Add(c.TTL)
	}
	return id, exp, err
}

func (s *store) CreateAccessAndRefreshTokens(ctx context.Context, req op.TokenRequest, refresh string) (string, string, time.Time, error) {
	id, newRefresh, exp, err := s.Storage.CreateAccessAndRefreshTokens(ctx, req, refresh)
	if c, ok := s.clientOf(req); ok && c.TTL != 0 {
		exp = time.Now().Add(c.TTL)
	}
	return id, newRefresh, exp, err
}

// GetPrivateClaimsFromRequest puts the scopes and the client's claims in
// its access tokens.
func (s *store) GetPrivateClaimsFromRequest(_ context.Context, req op.TokenRequest, scopes []string) (map[string]any, error) {
	claims := map[string]any{"scope": strings.Join(scopes, " ")}
	if c, ok := s.clientOf(req); ok {
		for k, v := range c.Claims {
			claims[k] = v
		}
	}
	return claims, nil
}

var _ op.CanGetPrivateClaimsFromRequest = (*store)(nil)
