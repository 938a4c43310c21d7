package tenant

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/codemode-go/codemode/edge/internal/oidctoken"
	"github.com/codemode-go/codemode/edge/internal/oidctoken/oidctest"
	"github.com/codemode-go/codemode/internal/secretfile"
)

// TestAnonymousIsReserved: a key file that names the tenant of keyless
// callers is refused, so that a key never reaches their sessions.
func TestAnonymousIsReserved(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "keys.json")
	if err := os.WriteFile(path, []byte(`{"k-0123456789abcdef": "team-a", "k-fedcba9876543210": "anonymous"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), `"anonymous" is reserved`) {
		t.Fatalf("Load of keys naming %q: %v, want an error saying the name is reserved", Anonymous, err)
	}
}

// TestResolve: without keys every caller is Anonymous; with keys, a caller
// without a valid one is refused, never Anonymous.
func TestResolve(t *testing.T) {
	t.Parallel()
	keyless, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	keyed, err := New(map[string]string{"k-0123456789abcdef": "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	header := func(auth string) http.Header {
		h := http.Header{}
		if auth != "" {
			h.Set("Authorization", auth)
		}
		return h
	}
	for _, tc := range []struct {
		name   string
		r      *Resolver
		auth   string
		tenant string // "": refused
	}{
		{"keyless edge, no key", keyless, "", Anonymous},
		{"keyless edge, any key", keyless, "Bearer k-0123456789abcdef", Anonymous},
		{"keyed edge, the key", keyed, "Bearer k-0123456789abcdef", "team-a"},
		{"keyed edge, no key", keyed, "", ""},
		{"keyed edge, empty key", keyed, "Bearer ", ""},
		{"keyed edge, unknown key", keyed, "Bearer k-unknown-unknown-0", ""},
		{"keyed edge, not bearer", keyed, "Basic k-0123456789abcdef", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := tc.r.Resolve(header(tc.auth))
			switch {
			case tc.tenant == "" && (err == nil || got != ""):
				t.Errorf("Resolve = %q, %v; want refused", got, err)
			case tc.tenant != "" && (err != nil || got != tc.tenant):
				t.Errorf("Resolve = %q, %v; want %q", got, err, tc.tenant)
			}
		})
	}
}

func TestLoadRefusesKeysOthersCanRead(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const key = "k-0123456789abcdef-team-a"
	for _, tt := range []struct {
		mode os.FileMode
		ok   bool
	}{
		{0o600, true},
		{0o400, true},
		{0o640, false},
		{0o644, false},
		{0o606, false},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, fmt.Sprintf("keys-%04o.json", tt.mode))
			if err := os.WriteFile(path, []byte(`{"`+key+`": "team-a"}`), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tt.mode); err != nil {
				t.Fatal(err)
			}
			r, err := Load(path)
			if tt.ok {
				if err != nil || !r.Enabled() {
					t.Fatalf("mode %04o: %v, want the keys", tt.mode, err)
				}
				return
			}
			if r != nil || !errors.Is(err, secretfile.ErrExposed) {
				t.Fatalf("mode %04o: %v, want a refusal (secretfile.ErrExposed)", tt.mode, err)
			}
			if msg := err.Error(); !strings.Contains(msg, "chmod 600 "+path) || strings.Contains(msg, key) {
				t.Errorf("mode %04o: %q, want the fix (chmod 600 %s) and no key", tt.mode, msg, path)
			}
		})
	}
}

// TestTokensBesideKeys: on an edge with keys and an issuer, a key is its
// tenant with every right, a token the tenant its claim maps to with its
// scopes' rights, and anything else is refused with the code that says
// why; an edge with keys only takes no token.
func TestTokensBesideKeys(t *testing.T) {
	t.Parallel()
	p := oidctest.Start(t)
	cfg := oidctoken.Config{Issuers: []oidctoken.Issuer{{Issuer: p.Issuer, Audiences: []string{"edge"}, TenantClaim: "org",
		Tenants: map[string]string{"o1": "team-a", "o2": "team-b"}}}}
	v, err := oidctoken.New(cfg, &http.Client{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	keys, err := New(map[string]string{"k-0123456789abcdef": "team-a"})
	if err != nil {
		t.Fatal(err)
	}
	both, err := keys.WithTokens(v, cfg)
	if err != nil {
		t.Fatal(err)
	}
	tokenB := p.Token(t, p.Register(oidctest.Client{Audience: []string{"edge"}, Claims: map[string]any{"org": "o2"}}), "codemode:read")
	outside := p.Token(t, p.Register(oidctest.Client{Audience: []string{"edge"}, Claims: map[string]any{"org": "o9"}}), "codemode:read")
	h := func(bearer string) http.Header { return http.Header{"Authorization": {"Bearer " + bearer}} }
	for _, tc := range []struct {
		name   string
		r      *Resolver
		bearer string
		want   Identity
		code   connect.Code
	}{
		{"key", both, "k-0123456789abcdef", Identity{Tenant: "team-a", Rights: oidctoken.AllRights}, 0},
		{"token", both, tokenB, Identity{Tenant: "team-b", Rights: oidctoken.Read}, 0},
		{"token outside the allow-list", both, outside, Identity{}, connect.CodePermissionDenied},
		{"forged token", both, oidctest.SignedByAnotherKey(tokenB), Identity{}, connect.CodeUnauthenticated},
		{"token on an edge with keys only", keys, tokenB, Identity{}, connect.CodeUnauthenticated},
	} {
		id, err := tc.r.Identify(t.Context(), h(tc.bearer))
		if tc.code != 0 {
			if err == nil || Code(err) != tc.code {
				t.Errorf("%s: %+v %v, want %v", tc.name, id, err, tc.code)
			}
			continue
		}
		id.Subject = "" // a hash, checked in oidctoken
		if err != nil || id != tc.want {
			t.Errorf("%s: %+v %v, want %+v", tc.name, id, err, tc.want)
		}
	}
	if _, err := keys.WithTokens(v, oidctoken.Config{Issuers: []oidctoken.Issuer{{Tenants: map[string]string{"x": Anonymous}}}}); err == nil {
		t.Error("a token tenant named anonymous was accepted")
	}
}
