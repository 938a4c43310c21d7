package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/secretfile"
	"github.com/codemode-go/codemode/internal/server"
)

const testSecret = "0123456789abcdef0123456789abcdef"

func TestNewSecret(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in string
		ok bool
	}{
		{testSecret, true},
		{"  " + testSecret + "\n", true},
		{testSecret[:31], false},
		{"", false},
		{testSecret[:16] + " " + testSecret[16:], false},
	} {
		_, err := NewSecret(tt.in)
		if (err == nil) != tt.ok {
			t.Errorf("NewSecret(%q): %v, want ok %v", tt.in, err, tt.ok)
		}
	}
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	s, err := NewSecret(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, path, header string
		ok                 bool
	}{
		{"right", "/codemode.agent.v1.AgentService/Execute", "Bearer " + testSecret, true},
		{"missing", "/codemode.agent.v1.AgentService/Execute", "", false},
		{"wrong", "/codemode.agent.v1.AgentService/Execute", "Bearer " + strings.ToUpper(testSecret), false},
		{"prefix", "/codemode.agent.v1.AgentService/Execute", "Bearer " + testSecret[:20], false},
		{"basic", "/run", "Basic " + testSecret, false},
		{"reflection", "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", "", false},
		{"health", "/grpc.health.v1.Health/Check", "", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, tt.path, nil)
			if tt.header != "" {
				r.Header.Set("Authorization", tt.header)
			}
			_, err := s.Authenticate(r)
			if (err == nil) != tt.ok {
				t.Errorf("Authenticate: %v, want ok %v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrUnauthenticated) {
				t.Errorf("error %v is not ErrUnauthenticated", err)
			}
		})
	}
	// No secret: everything passes (the service is on loopback).
	var none *Secret
	if _, err := none.Authenticate(httptest.NewRequest(http.MethodPost, "/run", nil)); err != nil {
		t.Errorf("nil secret: %v", err)
	}
}

func TestClientSendsTheSecret(t *testing.T) {
	t.Parallel()
	s, _ := NewSecret(testSecret)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.Authenticate(r); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
		}
	}))
	defer srv.Close()
	for _, tt := range []struct {
		name   string
		client *http.Client
		want   int
	}{
		{"with", (&Links{Secret: s}).Client(srv.Client()), http.StatusOK},
		{"without", srv.Client(), http.StatusUnauthorized},
	} {
		res, err := tt.client.Post(srv.URL+"/x", "text/plain", bytes.NewReader(nil))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tt.want {
			t.Errorf("%s the secret: HTTP %d, want %d", tt.name, res.StatusCode, tt.want)
		}
	}
}

// privateAddr is a private address, built rather than written: BindAddr
// only classifies it, nothing dials it.
var privateAddr = netip.AddrFrom4([4]byte{10, 1, 2, 3}).String()

func TestBindAddr(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		addr    string
		secured bool
		want    string // "" for an error
	}{
		{":8080", false, "127.0.0.1:8080"},
		{"127.0.0.1:8080", false, "127.0.0.1:8080"},
		{"127.0.0.2:8080", false, "127.0.0.2:8080"},
		{"localhost:8080", false, "localhost:8080"},
		{"[::1]:8080", false, "[::1]:8080"},
		{"0.0.0.0:8080", false, ""},
		{"[::]:8080", false, ""},
		{privateAddr + ":8080", false, ""},
		{"example.internal:8080", false, ""},
		{":8080", true, ":8080"},
		{"0.0.0.0:8080", true, "0.0.0.0:8080"},
	} {
		got, err := BindAddr(tt.addr, tt.secured, "agent")
		switch {
		case tt.want == "" && err == nil:
			t.Errorf("BindAddr(%q, %v) = %q, want an error", tt.addr, tt.secured, got)
		case tt.want == "" && !strings.Contains(err.Error(), SecretFileEnv):
			t.Errorf("BindAddr(%q): error %q does not say how to configure a secret", tt.addr, err)
		case tt.want != "" && (err != nil || got != tt.want):
			t.Errorf("BindAddr(%q, %v) = %q, %v, want %q", tt.addr, tt.secured, got, err, tt.want)
		}
	}
}

func TestKey(t *testing.T) {
	t.Parallel()
	a, _ := NewSecret(testSecret)
	b, _ := NewSecret(strings.Repeat("z", 32))
	var none *Secret
	keys := map[string][]byte{
		"a/x": a.Key("x"), "a/y": a.Key("y"), "b/x": b.Key("x"), "none/x": none.Key("x"),
	}
	seen := map[string]string{}
	for name, k := range keys {
		if other, ok := seen[string(k)]; ok {
			t.Errorf("keys %s and %s are equal", name, other)
		}
		seen[string(k)] = name
	}
	if !bytes.Equal(a.Key("x"), a.Key("x")) {
		t.Error("Key is not deterministic")
	}
}

func TestSecretFileMustBeTheServicesOwn(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tt := range []struct {
		mode os.FileMode
		ok   bool
	}{
		{0o600, true},
		{0o400, true},
		{0o640, false},
		{0o644, false},
		{0o604, false},
		{0o660, false},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, fmt.Sprintf("secret-%04o", tt.mode))
			if err := os.WriteFile(path, []byte(testSecret+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tt.mode); err != nil {
				t.Fatal(err)
			}
			f := cli.NewFlags("test", io.Discard)
			load := Flags(f)
			if err := f.Parse([]string{"--cluster-secret-file", path}, func(string) string { return "" }); err != nil {
				t.Fatal(err)
			}
			s, err := load(func(string) string { return "" })
			if tt.ok {
				if err != nil || s == nil {
					t.Fatalf("mode %04o: %v, want the secret", tt.mode, err)
				}
				return
			}
			if s != nil || !errors.Is(err, secretfile.ErrExposed) {
				t.Fatalf("mode %04o: %v, want a refusal (secretfile.ErrExposed)", tt.mode, err)
			}
			if msg := err.Error(); !strings.Contains(msg, "chmod 600 "+path) || strings.Contains(msg, testSecret) {
				t.Errorf("mode %04o: %q, want the fix (chmod 600 %s) and not the secret", tt.mode, msg, path)
			}
		})
	}
}

// TestBrowsers checks that an internal service refuses every web page, and
// answers any host name with a secret but only loopback's names without.
func TestBrowsers(t *testing.T) {
	t.Parallel()
	secret, err := NewSecret(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name          string
		secret        *Secret
		host, origin  string
		status        int
		authenticated bool
	}{
		{name: "no secret, curl", host: "127.0.0.1:8080", status: http.StatusOK},
		{name: "no secret, localhost", host: "localhost:8080", status: http.StatusOK},
		{name: "no secret, a page", host: "127.0.0.1:8080", origin: "http://127.0.0.1:5173", status: http.StatusForbidden},
		{name: "no secret, a rebound name", host: "rebind.example:8080", status: http.StatusForbidden},
		{name: "secret, a page", secret: secret, host: "cp-1:8080", origin: "https://evil.example", authenticated: true, status: http.StatusForbidden},
		{name: "secret, a name", secret: secret, host: "agent-1.agents.svc:30031", authenticated: true, status: http.StatusOK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := server.New(slog.New(slog.DiscardHandler))
			srv.Authenticate = tt.secret.Authenticate
			srv.Browsers = tt.secret.Browsers()
			srv.Handle("/run", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			r := httptest.NewRequest(http.MethodPost, "/run", strings.NewReader("{}"))
			r.Host = tt.host
			if tt.origin != "" {
				r.Header.Set("Origin", tt.origin)
			}
			if tt.authenticated {
				r.Header.Set("Authorization", "Bearer "+testSecret)
			}
			w := httptest.NewRecorder()
			srv.Handler().ServeHTTP(w, r)
			if w.Code != tt.status {
				t.Fatalf("HTTP %d, want %d: %s", w.Code, tt.status, w.Body)
			}
		})
	}
}

// failTransport fails the test if a request reaches it.
type failTransport struct{ t *testing.T }

func (f failTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	f.t.Errorf("request to %s was sent", r.URL)
	return nil, errors.New("not sent")
}

// The secret is never sent in clear text off loopback: plain http:// to a
// host that is not a loopback address or localhost is refused before
// anything is dialled, unless Insecure; https:// and loopback go through.
func TestSecretNotSentInClear(t *testing.T) {
	s, err := NewSecret(strings.Repeat("s", MinSecretLen))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		url   string
		clear bool
	}{
		{"http://127.0.0.1:8080/x", false},
		{"http://127.9.9.9:8080/x", false},
		{"http://[::1]:8080/x", false},
		{"http://localhost:8080/x", false},
		{"http://LOCALHOST/x", false},
		{"http://[::ffff:127.0.0.1]:8080/x", false},
		{"https://controlplane.internal:8080/x", false},
		{"http://controlplane.internal:8080/x", true},
		{"http://localhost.example:8080/x", true},
		{"http://192.0.2.10:8080/x", true}, // TEST-NET-1: never dialled here
		{"http://[2001:db8::1]:8080/x", true},
	} {
		u, err := url.Parse(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if got := inClear(u); got != tc.clear {
			t.Errorf("inClear(%s) = %v, want %v", tc.url, got, tc.clear)
		}
	}
	c := (&Links{Secret: s}).Client(&http.Client{Transport: failTransport{t}})
	_, err = c.Get("http://controlplane.internal:8080/status")
	if !errors.Is(err, ErrSecretInClear) {
		t.Errorf("plain HTTP off loopback: %v, want ErrSecretInClear", err)
	}
	// With Insecure the request goes on to the transport.
	var sent *http.Request
	insecure := (&Links{Secret: s, Insecure: true}).Client(&http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = r
		return nil, errors.New("stop here")
	})})
	_, _ = insecure.Get("http://controlplane.internal:8080/status")
	if sent == nil || sent.Header.Get("Authorization") != "Bearer "+strings.Repeat("s", MinSecretLen) {
		t.Errorf("--insecure-internal: request not handed on with the secret")
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
