package oidctoken

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"
)

// Defaults.
const (
	// DefaultClockSkew is how far a token's times may be off the edge's
	// clock.
	DefaultClockSkew = 30 * time.Second
	// MaxClockSkew is the most skew a configuration may allow.
	MaxClockSkew = 5 * time.Minute
	// DefaultKeysRefresh is how often an issuer's keys are fetched again
	// when nothing asks sooner: a key the issuer stops publishing stops
	// verifying tokens at most this long after.
	DefaultKeysRefresh = 5 * time.Minute
	// DefaultMinKeysRefresh is the least time between two fetches of an
	// issuer's keys caused by tokens naming a key it does not know, so
	// that such tokens cannot make the edge hammer the issuer.
	DefaultMinKeysRefresh = 10 * time.Second
	// DefaultCacheSize is how many verified tokens are remembered.
	DefaultCacheSize = 10000
)

// DefaultScopes are the scopes that grant each right when an issuer's
// configuration names none.
var defaultScopes = map[string][]string{
	"codemode:read":     {"read"},
	"codemode:execute":  {"execute"},
	"codemode:sessions": {"sessions"},
	"codemode:apis":     {"apis"},
}

// Config says which issuers' tokens the edge accepts, read from a JSON
// file:
//
//	{
//	  "clockSkew": "30s",
//	  "issuers": [{
//	    "issuer": "https://login.example.com/realms/acme",
//	    "audiences": ["https://codemode.example.com/mcp"],
//	    "tenantClaim": "org_id",
//	    "tenants": {"org-1234": "team-a", "org-5678": "team-b"},
//	    "scopes": {"codemode:execute": ["execute"], "codemode:read": ["read"]}
//	  }]
//	}
//
// A Config is read once; the issuers' keys are fetched, cached and
// refreshed while the edge runs.
type Config struct {
	// Issuers whose tokens are accepted.
	Issuers []Issuer `json:"issuers"`
	// ClockSkew is how far exp, nbf and iat may be off the edge's clock;
	// empty: DefaultClockSkew, at most MaxClockSkew.
	ClockSkew Duration `json:"clockSkew,omitempty"`
	// CacheSize is how many verified tokens are remembered; 0:
	// DefaultCacheSize.
	CacheSize int `json:"cacheSize,omitempty"`
}

// Issuer is one OpenID provider whose access tokens (JWTs, RFC 9068) the
// edge accepts.
type Issuer struct {
	// Issuer is the issuer's URL, exactly as in its tokens' iss claim and
	// its discovery document (Issuer + "/.well-known/openid-configuration").
	// https, or http on a loopback address.
	Issuer string `json:"issuer"`
	// Audiences: a token must name at least one of them in aud. For MCP
	// clients that follow the MCP authorization specification, this is the
	// edge's resource URL (https://edge.example.com/mcp).
	Audiences []string `json:"audiences"`
	// TenantClaim names the claim that says the caller's tenant: a string or
	// an array of strings (a group claim).
	TenantClaim string `json:"tenantClaim"`
	// Tenants maps the tenant claim's values to tenant names: the
	// allow-list. A token whose claim has no listed value, or values that
	// map to two tenants, is refused.
	Tenants map[string]string `json:"tenants"`
	// Scopes maps each scope (in the scope or scp claim) to the rights it
	// grants: "read", "execute", "sessions", "apis". Empty: codemode:read,
	// codemode:execute, codemode:sessions and codemode:apis grant the right
	// of their name.
	Scopes map[string][]string `json:"scopes,omitempty"`
	// Algorithms the issuer's tokens may be signed with; empty: the
	// asymmetric ones its discovery document lists. Only asymmetric
	// algorithms (RS*, PS*, ES*, EdDSA) are accepted, never none or HMAC.
	Algorithms []string `json:"algorithms,omitempty"`
	// KeysRefresh is how often the issuer's keys are fetched again; empty:
	// DefaultKeysRefresh.
	KeysRefresh Duration `json:"keysRefresh,omitempty"`
	// MinKeysRefresh is the least time between two fetches caused by
	// tokens naming an unknown key; empty: DefaultMinKeysRefresh.
	MinKeysRefresh Duration `json:"minKeysRefresh,omitempty"`
	// PlaygroundClientID is the client id the web playground signs users in
	// with (a public client: authorization code with PKCE, redirect URI the
	// edge's page, "<public URL>/"); empty: the playground does not offer
	// sign-in with this issuer. The first issuer with one is used.
	PlaygroundClientID string `json:"playgroundClientId,omitempty"`
}

// Duration is a time.Duration written in JSON as a string ("30s").
type Duration time.Duration

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string such as \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// Load reads the configuration at path; an empty path means no issuers.
func Load(path string) (Config, error) {
	if path == "" {
		return Config{}, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read oidc config: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return Config{}, fmt.Errorf("oidc config %s: %w", path, err)
	}
	return c, nil
}

// Parse parses and validates a configuration (see [Config]).
func Parse(b []byte) (Config, error) {
	var c Config
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&c); err != nil {
		return Config{}, err
	}
	return c, c.Validate()
}

// Validate reports whether the configuration can be used.
func (c Config) Validate() error {
	var errs []error
	if c.ClockSkew < 0 || time.Duration(c.ClockSkew) > MaxClockSkew {
		errs = append(errs, fmt.Errorf("clock skew %s: want between 0 and %s", time.Duration(c.ClockSkew), MaxClockSkew))
	}
	if c.CacheSize < 0 {
		errs = append(errs, fmt.Errorf("cache size %d is negative", c.CacheSize))
	}
	seen, playground := map[string]bool{}, 0
	for _, is := range c.Issuers {
		if err := is.validate(); err != nil {
			errs = append(errs, fmt.Errorf("issuer %q: %w", is.Issuer, err))
		}
		if seen[is.Issuer] {
			errs = append(errs, fmt.Errorf("issuer %q is listed twice", is.Issuer))
		}
		seen[is.Issuer] = true
		if is.PlaygroundClientID != "" {
			playground++
		}
	}
	if playground > 1 {
		errs = append(errs, errors.New("more than one issuer has a playgroundClientId"))
	}
	return errors.Join(errs...)
}

// TenantNames returns every tenant name the configuration maps a claim
// to, for the caller to check.
func (c Config) TenantNames() []string {
	var out []string
	for _, is := range c.Issuers {
		for _, t := range is.Tenants {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func (is Issuer) validate() error {
	var errs []error
	u, err := url.Parse(is.Issuer)
	switch {
	case err != nil:
		errs = append(errs, err)
	case u.Host == "" || u.RawQuery != "" || u.Fragment != "":
		errs = append(errs, errors.New("want an https URL with no query or fragment"))
	case u.Scheme == "http" && !isLoopback(u.Hostname()):
		errs = append(errs, errors.New("http is allowed for loopback issuers only: use https"))
	case u.Scheme != "https" && u.Scheme != "http":
		errs = append(errs, errors.New("want an https URL"))
	}
	if len(is.Audiences) == 0 {
		errs = append(errs, errors.New("no audiences: name this edge's resource URL or the audience the issuer puts in its tokens"))
	}
	if is.TenantClaim == "" {
		errs = append(errs, errors.New("no tenant claim"))
	}
	if len(is.Tenants) == 0 {
		errs = append(errs, errors.New("no tenants: map the tenant claim's values to tenant names"))
	}
	for scope, rights := range is.Scopes {
		if _, err := parseRights(rights); err != nil {
			errs = append(errs, fmt.Errorf("scope %q: %w", scope, err))
		}
	}
	for _, a := range is.Algorithms {
		if !slices.Contains(asymmetric, a) {
			errs = append(errs, fmt.Errorf("algorithm %q: want one of %s", a, strings.Join(asymmetric, ", ")))
		}
	}
	if is.KeysRefresh < 0 || is.MinKeysRefresh < 0 {
		errs = append(errs, errors.New("negative keys refresh"))
	}
	return errors.Join(errs...)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
