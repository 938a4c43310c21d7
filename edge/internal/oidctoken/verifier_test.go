package oidctoken_test

import (
	"context"
	"crypto"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/codemode-go/codemode/edge/internal/oidctoken"
	"github.com/codemode-go/codemode/edge/internal/oidctoken/oidctest"
)

const audience = "https://edge.test/mcp"

func config(issuer string) oidctoken.Config {
	return oidctoken.Config{Issuers: []oidctoken.Issuer{{
		Issuer: issuer, Audiences: []string{audience}, TenantClaim: "org_id",
		Tenants:        map[string]string{"org-a": "team-a", "org-b": "team-b"},
		MinKeysRefresh: oidctoken.Duration(time.Nanosecond),
	}}}
}

func newVerifier(t testing.TB, cfg oidctoken.Config, opts ...oidctoken.Option) *oidctoken.Verifier {
	t.Helper()
	v, err := oidctoken.New(cfg, &http.Client{Timeout: 10 * time.Second}, slog.New(slog.NewTextHandler(io.Discard, nil)), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// forge returns token with its header replaced by header and its
// signature by sig(signing input).
func forge(token string, header map[string]any, sig func(input []byte) []byte) string {
	parts := strings.Split(token, ".")
	h, _ := json.Marshal(header)
	input := base64.RawURLEncoding.EncodeToString(h) + "." + parts[1]
	return input + "." + base64.RawURLEncoding.EncodeToString(sig([]byte(input)))
}

// publicJWK returns the provider's published key, as JSON bytes.
func publicJWK(t *testing.T, issuer string) []byte {
	t.Helper()
	res, err := http.Get(issuer + "/keys")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var set jose.JSONWebKeySet
	if err := json.NewDecoder(res.Body).Decode(&set); err != nil {
		t.Fatal(err)
	}
	b, _ := set.Keys[0].MarshalJSON()
	return b
}

// TestVerify: a real provider's tokens are accepted, with their tenant and
// rights, and every kind of bad token is refused with the error that says
// why.
func TestVerify(t *testing.T) {
	p := oidctest.Start(t)
	other := oidctest.Start(t) // an issuer this edge does not trust
	v := newVerifier(t, config(p.Issuer))

	good := p.Register(oidctest.Client{Audience: []string{audience}, Claims: map[string]any{"org_id": "org-a"}})
	groups := p.Register(oidctest.Client{Audience: []string{audience}, Claims: map[string]any{"org_id": []string{"unlisted", "org-b"}}})
	expired := p.Register(oidctest.Client{Audience: []string{audience}, Claims: map[string]any{"org_id": "org-a"}, TTL: -time.Minute})
	wrongAud := p.Register(oidctest.Client{Audience: []string{"https://elsewhere.test/mcp"}, Claims: map[string]any{"org_id": "org-a"}})
	outside := p.Register(oidctest.Client{Audience: []string{audience}, Claims: map[string]any{"org_id": "org-evil"}})
	twoTenants := p.Register(oidctest.Client{Audience: []string{audience}, Claims: map[string]any{"org_id": []string{"org-a", "org-b"}}})
	noTenant := p.Register(oidctest.Client{Audience: []string{audience}})
	foreign := other.Register(oidctest.Client{Audience: []string{audience}, Claims: map[string]any{"org_id": "org-a"}})

	tok := p.Token(t, good, "codemode:execute")
	stranger, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	header := func(alg string) map[string]any { return map[string]any{"alg": alg, "kid": p.KeyID(), "typ": "JWT"} }

	for _, tc := range []struct {
		name   string
		token  string
		tenant string // want; "" when refused
		rights oidctoken.Rights
		err    error
		msg    string
	}{
		{name: "valid", token: tok, tenant: "team-a", rights: oidctoken.Execute | oidctoken.Read},
		{name: "group claim", token: p.Token(t, groups, "codemode:read", "openid"), tenant: "team-b", rights: oidctoken.Read},
		{name: "all scopes", token: p.Token(t, good, "codemode:execute", "codemode:sessions", "codemode:apis"), tenant: "team-a", rights: oidctoken.AllRights},
		{name: "no codemode scope", token: p.Token(t, good, "email"), tenant: "team-a", rights: 0},
		{name: "expired", token: p.Token(t, expired, "codemode:execute"), err: oidctoken.ErrInvalid, msg: "expired"},
		{name: "wrong audience", token: p.Token(t, wrongAud, "codemode:execute"), err: oidctoken.ErrInvalid, msg: "audience"},
		{name: "wrong issuer", token: other.Token(t, foreign, "codemode:execute"), err: oidctoken.ErrInvalid, msg: "issuer is not trusted"},
		{name: "tenant outside the allow-list", token: p.Token(t, outside, "codemode:execute"), err: oidctoken.ErrTenantNotAllowed},
		{name: "two tenants", token: p.Token(t, twoTenants, "codemode:execute"), err: oidctoken.ErrTenantNotAllowed, msg: "both"},
		{name: "no tenant claim", token: p.Token(t, noTenant, "codemode:execute"), err: oidctoken.ErrTenantNotAllowed},
		{name: "alg none", token: forge(tok, header("none"), func([]byte) []byte { return nil }), err: oidctoken.ErrInvalid},
		{name: "alg none, no signature part", token: strings.Join(strings.Split(forge(tok, header("none"), func([]byte) []byte { return nil }), ".")[:2], ".") + ".", err: oidctoken.ErrInvalid},
		{name: "HMAC keyed with the public key", token: forge(tok, header("HS256"), func(in []byte) []byte {
			m := hmac.New(sha256.New, publicJWK(t, p.Issuer))
			m.Write(in)
			return m.Sum(nil)
		}), err: oidctoken.ErrInvalid},
		{name: "another key's signature", token: forge(tok, header("RS256"), func(in []byte) []byte {
			h := sha256.Sum256(in)
			sig, err := rsa.SignPKCS1v15(rand.Reader, stranger, crypto.SHA256, h[:])
			if err != nil {
				t.Fatal(err)
			}
			return sig
		}), err: oidctoken.ErrInvalid, msg: "signature"},
		{name: "tampered claims", token: tamper(t, tok), err: oidctoken.ErrInvalid, msg: "signature"},
		{name: "not a JWT", token: "a.b.c", err: oidctoken.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 2 { // the second time from the cache, if cached
				id, err := v.Verify(t.Context(), tc.token)
				if tc.err != nil {
					if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
						t.Fatalf("Verify: %v, want %v (%q)", err, tc.err, tc.msg)
					}
					continue
				}
				if err != nil {
					t.Fatalf("Verify: %v", err)
				}
				if id.Tenant != tc.tenant || id.Rights != tc.rights || id.Issuer != p.Issuer {
					t.Fatalf("Verify: %+v, want tenant %s rights %s", id, tc.tenant, tc.rights)
				}
				if len(id.Subject) != 32 || strings.Contains(id.Subject, good.ID) {
					t.Fatalf("subject %q: want a 32-digit hash that does not name the subject", id.Subject)
				}
			}
		})
	}

	t.Run("bounded clock skew", func(t *testing.T) {
		raw := p.Token(t, good, "codemode:execute") // valid 5 minutes
		for _, tc := range []struct {
			name  string
			shift time.Duration
			ok    bool
			msg   string
		}{
			{"expired within the skew", 5*time.Minute + 20*time.Second, true, ""},
			{"expired beyond the skew", 5*time.Minute + 40*time.Second, false, "expired"},
			{"edge clock behind, within the skew", -20 * time.Second, true, ""},
			{"not valid yet beyond the skew", -40 * time.Second, false, "not valid yet"},
		} {
			shifted := newVerifier(t, config(p.Issuer), oidctoken.WithClock(func() time.Time { return time.Now().Add(tc.shift) }))
			_, err := shifted.Verify(t.Context(), raw)
			if tc.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.msg)) {
				t.Errorf("%s: %v, want ok=%v (%q)", tc.name, err, tc.ok, tc.msg)
			}
		}
	})

	t.Run("issuer unreachable", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		closed := "http://" + ln.Addr().String()
		ln.Close()
		cfg := config(p.Issuer)
		cfg.Issuers = append(cfg.Issuers, config(closed).Issuers[0])
		cfg.Issuers[1].Issuer = closed
		unreachable := newVerifier(t, cfg)
		forged := forgeIssuer(t, tok, closed, stranger)
		if _, err := unreachable.Verify(t.Context(), forged); !errors.Is(err, oidctoken.ErrIssuerUnavailable) {
			t.Fatalf("Verify with the issuer down: %v, want ErrIssuerUnavailable", err)
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		fresh := newVerifier(t, config(p.Issuer))
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 50 {
					if id, err := fresh.Verify(t.Context(), tok); err != nil || id.Tenant != "team-a" {
						t.Errorf("Verify: %+v %v", id, err)
						return
					}
				}
			})
		}
		wg.Wait()
	})

	// Last: it changes the provider's key.
	t.Run("key rotation", func(t *testing.T) {
		old := p.Token(t, good, "codemode:execute")
		if _, err := v.Verify(t.Context(), old); err != nil {
			t.Fatalf("token before rotation: %v", err)
		}
		p.Rotate()
		fresh := p.Token(t, good, "codemode:execute")
		if _, err := v.Verify(t.Context(), fresh); err != nil {
			t.Fatalf("token signed with the new key, same verifier: %v", err)
		}
		if _, err := v.Verify(t.Context(), old); !errors.Is(err, oidctoken.ErrInvalid) {
			t.Fatalf("token of the key the issuer no longer publishes (cached before): %v, want ErrInvalid", err)
		}
	})
}

// tamper changes a claim of token without signing it again.
func tamper(t *testing.T, token string) string {
	parts := strings.Split(token, ".")
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(b, &claims); err != nil {
		t.Fatal(err)
	}
	claims["org_id"] = "org-b"
	b, _ = json.Marshal(claims)
	parts[1] = base64.RawURLEncoding.EncodeToString(b)
	return strings.Join(parts, ".")
}

// forgeIssuer returns token's claims with iss set to issuer, signed by key.
func forgeIssuer(t *testing.T, token, issuer string, key *rsa.PrivateKey) string {
	parts := strings.Split(token, ".")
	b, _ := base64.RawURLEncoding.DecodeString(parts[1])
	var claims map[string]any
	if err := json.Unmarshal(b, &claims); err != nil {
		t.Fatal(err)
	}
	claims["iss"] = issuer
	b, _ = json.Marshal(claims)
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key}, (&jose.SignerOptions{}).WithHeader("kid", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	jws, err := s.Sign(b)
	if err != nil {
		t.Fatal(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestConfig: configurations that would weaken the checks are refused.
func TestConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, json, msg string
	}{
		{"http issuer off loopback", `{"issuers":[{"issuer":"http://login.example.test","audiences":["a"],"tenantClaim":"org","tenants":{"x":"t"}}]}`, "loopback"},
		{"HMAC algorithm", `{"issuers":[{"issuer":"https://login.example.test","audiences":["a"],"tenantClaim":"org","tenants":{"x":"t"},"algorithms":["HS256"]}]}`, "HS256"},
		{"none algorithm", `{"issuers":[{"issuer":"https://login.example.test","audiences":["a"],"tenantClaim":"org","tenants":{"x":"t"},"algorithms":["none"]}]}`, "none"},
		{"no audience", `{"issuers":[{"issuer":"https://login.example.test","tenantClaim":"org","tenants":{"x":"t"}}]}`, "audiences"},
		{"no allow-list", `{"issuers":[{"issuer":"https://login.example.test","audiences":["a"],"tenantClaim":"org"}]}`, "tenants"},
		{"skew too large", `{"clockSkew":"1h","issuers":[]}`, "clock skew"},
		{"unknown right", `{"issuers":[{"issuer":"https://login.example.test","audiences":["a"],"tenantClaim":"org","tenants":{"x":"t"},"scopes":{"s":["admin"]}}]}`, "admin"},
		{"unknown field", `{"issuer":"https://login.example.test"}`, "unknown field"},
	} {
		_, err := oidctoken.Parse([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want an error about %q", tc.name, err, tc.msg)
		}
	}
	if _, err := oidctoken.Parse([]byte(`{"clockSkew":"10s","issuers":[{"issuer":"https://login.example.test/realms/x","audiences":["a"],"tenantClaim":"groups","tenants":{"g":"team-a"},"scopes":{"run":["execute","sessions"]}}]}`)); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

// BenchmarkVerifyCached: a token the verifier has seen costs a hash and a
// map look-up. Prints p50/p99/p999 of single calls.
func BenchmarkVerifyCached(b *testing.B) {
	p := oidctest.Start(b)
	v := newVerifier(b, config(p.Issuer))
	c := p.Register(oidctest.Client{Audience: []string{audience}, Claims: map[string]any{"org_id": "org-a"}})
	tok := p.Token(b, c, "codemode:execute", "codemode:sessions")
	if _, err := v.Verify(b.Context(), tok); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	durs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		if _, err := v.Verify(b.Context(), tok); err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(start))
	}
	b.StopTimer()
	reportPercentiles(b, durs)
}

// BenchmarkVerifyUncached is the baseline: a token seen for the first time
// (parsed, signature verified with the issuer's RSA key, claims checked),
// the keys already fetched.
func BenchmarkVerifyUncached(b *testing.B) {
	p := oidctest.Start(b)
	v := newVerifier(b, config(p.Issuer))
	c := p.Register(oidctest.Client{Audience: []string{audience}, Claims: map[string]any{"org_id": "org-a"}})
	tok := p.Token(b, c, "codemode:execute", "codemode:sessions")
	if _, err := v.Verify(b.Context(), tok); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	durs := make([]time.Duration, 0, b.N)
	for b.Loop() {
		start := time.Now()
		if _, err := v.VerifyUncached(b.Context(), tok); err != nil {
			b.Fatal(err)
		}
		durs = append(durs, time.Since(start))
	}
	reportPercentiles(b, durs)
}

func reportPercentiles(b *testing.B, durs []time.Duration) {
	if len(durs) == 0 {
		return
	}
	sort.Slice(durs, func(i, j int) bool { return durs[i] < durs[j] })
	at := func(q float64) time.Duration { return durs[min(len(durs)-1, int(q*float64(len(durs))))] }
	b.ReportMetric(float64(at(0.50).Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(at(0.99).Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(at(0.999).Nanoseconds()), "p999-ns")
	if len(durs) > 1000 {
		b.Logf("n=%d p50=%s p99=%s p99.9=%s max=%s", len(durs), at(0.50), at(0.99), at(0.999), durs[len(durs)-1])
	}
}

// FuzzVerify: no bytes make Verify panic, and none but a token the
// provider issued is accepted (seeded with one and its forgeries).
func FuzzVerify(f *testing.F) {
	p := oidctest.Start(f)
	v := newVerifier(f, config(p.Issuer))
	c := p.Register(oidctest.Client{Audience: []string{audience}, Claims: map[string]any{"org_id": "org-a"}})
	tok := p.Token(f, c, "codemode:execute")
	for _, s := range []string{tok, oidctest.AlgNone(tok), p.HMACWithPublicKey(tok), oidctest.SignedByAnotherKey(tok), "a.b.c", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := v.Verify(context.Background(), s)
		if err == nil && s != tok {
			// Only an encoding of the same signed bytes may pass.
			if id.Tenant != "team-a" || id.Issuer != p.Issuer {
				t.Fatalf("accepted %q as %+v", s, id)
			}
		}
	})
}
