// Package cluster authenticates the calls between codemode's services. The
// edge, the control plane and the agents of one deployment share a secret;
// every internal call carries it as a bearer token, and the control plane and
// the agents refuse any call without it before reading its body. Without a
// secret, an internal service serves on loopback only (see [BindAddr]).
//
// The secret is read from a file (--cluster-secret-file,
// CODEMODE_CLUSTER_SECRET_FILE) or from the variable CODEMODE_CLUSTER_SECRET;
// it is never taken from the command line, where other users could read it,
// and never logged. A file its group or other users may read or write is
// refused (see [secretfile.Read]). A Secret is immutable and safe for concurrent use.
package cluster

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/secretfile"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/tlsconfig"
)

// Environment variables of the secret.
const (
	SecretFileEnv = "CODEMODE_CLUSTER_SECRET_FILE"
	SecretEnv     = "CODEMODE_CLUSTER_SECRET"
)

// MinSecretLen is the shortest secret accepted, in bytes.
const MinSecretLen = 32

// ErrUnauthenticated is the refusal of a call without the cluster's secret.
var ErrUnauthenticated = errors.New("this is an internal service of codemode: calls must carry the cluster secret (Authorization: Bearer <secret>)")

// Secret is a deployment's shared secret.
type Secret struct {
	token string
	sum   [sha256.Size]byte
}

// NewSecret returns the secret s (surrounding white space removed).
func NewSecret(s string) (*Secret, error) {
	s = strings.TrimSpace(s)
	if len(s) < MinSecretLen {
		return nil, fmt.Errorf("cluster secret is %d bytes: want at least %d (for example `head -c 32 /dev/urandom | base64`)", len(s), MinSecretLen)
	}
	if strings.ContainsAny(s, " \t\r\n") {
		return nil, errors.New("cluster secret contains white space")
	}
	return &Secret{token: s, sum: sha256.Sum256([]byte(s))}, nil
}

// Flags defines --cluster-secret-file on f. The returned function, called
// after f is parsed, loads the secret: from that file, else from
// CODEMODE_CLUSTER_SECRET (read with getenv); nil when neither is set.
func Flags(f *cli.Flags) func(getenv func(string) string) (*Secret, error) {
	file := f.String("cluster-secret-file", "", "file holding the secret that the edge, control plane and agents share (or set "+SecretEnv+"), mode 0600 or 0400: one its group or others may read or write is refused; without one, internal services serve on loopback only")
	f.Env("cluster-secret-file", SecretFileEnv)
	return func(getenv func(string) string) (*Secret, error) {
		if *file != "" {
			b, err := secretfile.Read(*file)
			if err != nil {
				return nil, fmt.Errorf("read cluster secret: %w", err)
			}
			s, err := NewSecret(string(b))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", *file, err)
			}
			return s, nil
		}
		if v := getenv(SecretEnv); v != "" {
			s, err := NewSecret(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", SecretEnv, err)
			}
			return s, nil
		}
		return nil, nil
	}
}

// healthPrefix is the path of gRPC health checks, which stay open so that
// orchestrators can probe a service without the secret.
const healthPrefix = "/grpc.health.v1.Health/"

// Authenticate checks that r carries the secret, and returns r's context;
// it fits server.Server.Authenticate. gRPC health checks pass without it.
// It reads only r's header, so a refused body is never read. A nil Secret
// lets every request through.
func (s *Secret) Authenticate(r *http.Request) (context.Context, error) {
	if s == nil || strings.HasPrefix(r.URL.Path, healthPrefix) {
		return r.Context(), nil
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return nil, ErrUnauthenticated
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	if subtle.ConstantTimeCompare(sum[:], s.sum[:]) != 1 {
		return nil, ErrUnauthenticated
	}
	return r.Context(), nil
}

// Browsers says what web pages may do with an internal service (see
// server.Browsers): nothing. The internal services serve no page, so a
// request from a page of any origin is refused. With a secret they answer
// any host name (every call needs the secret, which a browser never sends,
// and agents are reached by name); without one they serve on loopback only
// and answer only names DNS cannot rebind (IP addresses and localhost).
func (s *Secret) Browsers() *server.Browsers {
	if s == nil {
		return &server.Browsers{}
	}
	return &server.Browsers{Hosts: []string{"*"}}
}

// WithBearer returns c with a transport that sends token as a bearer
// token (Authorization: Bearer token) with every request.
func WithBearer(c *http.Client, token string) *http.Client {
	out := *c
	base := c.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	out.Transport = &bearer{token: "Bearer " + token, base: base}
	return &out
}

type bearer struct {
	token string
	base  http.RoundTripper
	// guard refuses requests that would carry the token in clear text off
	// loopback (see inClear).
	guard bool
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	if b.guard && inClear(r.URL) {
		if r.Body != nil {
			r.Body.Close()
		}
		return nil, fmt.Errorf("%s: %w", r.URL.Host, ErrSecretInClear)
	}
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", b.token)
	return b.base.RoundTrip(r)
}

// Key derives a key for purpose from the secret, so that one secret can
// serve several uses without one use revealing another's key. Without a
// secret it derives from a fixed value: usable, but only as strong as the
// loopback binding that comes with having no secret.
func (s *Secret) Key(purpose string) []byte {
	seed := []byte("codemode: no cluster secret")
	if s != nil {
		seed = []byte(s.token)
	}
	m := hmac.New(sha256.New, seed)
	m.Write([]byte(purpose))
	return m.Sum(nil)
}

// BindAddr returns the address an internal service (what: "agent",
// "control plane") may listen on. With a secret, addr is returned as it is.
// Without one, only loopback is allowed: see [LoopbackAddr]; the error says
// how to configure a secret.
func BindAddr(addr string, secured bool, what string) (string, error) {
	if secured {
		return addr, nil
	}
	a, err := LoopbackAddr(addr)
	if errors.Is(err, ErrNotLoopback) {
		return "", fmt.Errorf("%s: refusing to serve on %s without a cluster secret: anyone who reaches it could run code and read sessions without passing the edge's API keys and policies. "+
			"Give the edge, control plane and agents the same secret (--cluster-secret-file FILE or %s=FILE, the file holding at least %d random bytes, e.g. from `head -c 32 /dev/urandom | base64`), "+
			"or serve on a loopback address such as 127.0.0.1", what, addr, SecretFileEnv, MinSecretLen)
	}
	return a, err
}

// ErrNotLoopback is returned by [LoopbackAddr] for an address off loopback.
var ErrNotLoopback = errors.New("not a loopback address")

// LoopbackAddr returns addr if it is on loopback, with a bare port
// (":8080") bound to 127.0.0.1; any other host is [ErrNotLoopback].
func LoopbackAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("address %q: %w", addr, err)
	}
	if host == "" {
		return net.JoinHostPort("127.0.0.1", port), nil
	}
	if host == "localhost" {
		return addr, nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return addr, nil
	}
	return "", fmt.Errorf("%s: %w", addr, ErrNotLoopback)
}

// Links say how a service calls the others of its cluster: with the
// secret, and over TLS to peers whose certificates the cluster's CA
// signed. Why TLS plus the secret rather than mutual TLS: RATIONALE.md.
type Links struct {
	// Secret is sent with every call; nil: none (loopback only).
	Secret *Secret
	// TLS trusts the cluster's CA; nil: peers are reached over plain
	// HTTP/2 (h2c), on loopback or a network that protects them. Its
	// RootCAs are the CAs read at start; Client's clients and ClientTLS's
	// configurations trust CA's current ones.
	TLS *tls.Config
	// CA is the cluster's CA file (--cluster-ca), read again when it
	// changes; nil: TLS's RootCAs, fixed.
	CA *tlsconfig.CAPool
	// Insecure lets the secret go in clear text to an address off loopback.
	Insecure bool
}

// ClientTLS returns the TLS configuration of a connection to serverName
// for a client that dials by itself (Redis's): trusting the CA file as it
// is at each handshake when there is one, else TLS's RootCAs; nil without
// TLS.
func (l *Links) ClientTLS(serverName string) *tls.Config {
	switch {
	case l == nil || l.TLS == nil:
		return nil
	case l.CA != nil:
		return l.CA.ClientConfig(serverName)
	}
	c := l.TLS.Clone()
	c.ServerName = serverName
	return c
}

// LinkFlags defines the flags of the secret (see Flags), --cluster-ca and
// --insecure-internal on f. The returned function loads them after f is
// parsed.
func LinkFlags(f *cli.Flags) func(getenv func(string) string) (*Links, error) {
	loadSecret := Flags(f)
	ca := f.String("cluster-ca", "", "PEM file of the CA that signed the other services' certificates, read again when it changes: calls to them go over TLS (https://), trusting only it; host:port then means https://host:port")
	f.Env("cluster-ca", "CODEMODE_CLUSTER_CA")
	insecure := f.Bool("insecure-internal", false, "allow sending the cluster secret over plain TCP to addresses off loopback (a network that encrypts and authenticates peers itself, such as WireGuard); without it such calls are refused")
	f.Env("insecure-internal", "CODEMODE_INSECURE_INTERNAL")
	return func(getenv func(string) string) (*Links, error) {
		s, err := loadSecret(getenv)
		if err != nil {
			return nil, err
		}
		l := &Links{Secret: s, Insecure: *insecure}
		if *ca != "" {
			if l.CA, err = tlsconfig.LoadCAPool(*ca, nil); err != nil {
				return nil, fmt.Errorf("--cluster-ca: %w", err)
			}
			l.TLS = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: l.CA.Pool()}
		}
		return l, nil
	}
}

// SecretOrNil is l's secret; nil for a nil Links.
func (l *Links) SecretOrNil() *Secret {
	if l == nil {
		return nil
	}
	return l.Secret
}

// URL returns the base URL of a peer given as a URL or as host:port:
// https://host:port with the cluster's CA, http://host:port without.
func (l *Links) URL(addr string) string {
	if strings.Contains(addr, "://") {
		return strings.TrimSuffix(addr, "/")
	}
	if l != nil && l.TLS != nil {
		return "https://" + addr
	}
	return "http://" + addr
}

// Client returns a client of the cluster's services: c (nil: a new
// server.NewClient) trusting the cluster's CA (with CA, the CAs in its
// file when each connection is made, see tlsconfig.CAPool.DialTLSContext),
// sending the secret with every request, and refusing to send it over
// plain HTTP to a host off loopback unless Insecure. A nil Links returns c
// as it is.
func (l *Links) Client(c *http.Client) *http.Client {
	if c == nil {
		c = server.NewClient()
	}
	if l == nil {
		return c
	}
	if l.TLS != nil {
		out := *c
		if t, ok := c.Transport.(*http.Transport); ok {
			t = t.Clone()
			t.TLSClientConfig = l.TLS.Clone()
			if l.CA != nil {
				t.DialTLSContext = l.CA.DialTLSContext(t.DialContext, func() *tls.Config { return t.TLSClientConfig })
			}
			out.Transport = t
		}
		c = &out
	}
	if l.Secret == nil {
		return c
	}
	out := *c
	out.Transport = &bearer{token: "Bearer " + l.Secret.token, base: transportOf(c), guard: !l.Insecure}
	return &out
}

func transportOf(c *http.Client) http.RoundTripper {
	if c.Transport == nil {
		return http.DefaultTransport
	}
	return c.Transport
}

// ErrSecretInClear is the refusal to send the cluster secret over plain
// HTTP to a host off loopback.
var ErrSecretInClear = errors.New("refusing to send the cluster secret over plain TCP off loopback: give the services certificates of a cluster CA (--tls-cert, --tls-key, --cluster-ca) and use https://, or, on a network that protects the link itself, --insecure-internal")

// inClear reports whether a request to u would carry the secret in clear
// text off loopback: plain http:// to a host that is not a loopback
// address or localhost.
func inClear(u *url.URL) bool {
	if u.Scheme != "http" {
		return false
	}
	host := u.Hostname()
	if strings.EqualFold(host, "localhost") {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err != nil || !ip.Unmap().IsLoopback()
}
