package edged

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

// TestBrowsers checks which pages may call the edge, and under which host
// names, for each way the edge can be configured.
func TestBrowsers(t *testing.T) {
	t.Parallel()
	base := Config{Addr: "127.0.0.1:8000", ControlPlanes: []string{DefaultControlPlane}}
	for _, tc := range []struct {
		name           string
		change         func(*Config)
		origins, hosts []string
	}{
		{name: "no keys: own pages, IP addresses and localhost only", change: func(*Config) {}},
		{name: "no keys, lists", change: func(c *Config) {
			c.AllowedOrigins, c.AllowedHosts = []string{"http://localhost:5173"}, []string{"codemode.example.com"}
		}, origins: []string{"http://localhost:5173"}, hosts: []string{"codemode.example.com"}},
		{name: "no keys, public on a name", change: func(c *Config) { c.Addr, c.PublicWithoutKeys = "codemode.lan:8000", true },
			hosts: []string{"codemode.lan"}},
		{name: "no keys, IPv6 loopback", change: func(c *Config) { c.Addr = "[::1]:8000" }},
		{name: "keys: any origin, any host", change: func(c *Config) { c.APIKeys = "keys.json" }, origins: []string{"*"}, hosts: []string{"*"}},
		{name: "keys, lists", change: func(c *Config) {
			c.APIKeys, c.AllowedOrigins, c.AllowedHosts = "keys.json", []string{"https://app.example.com"}, []string{"codemode.example.com"}
		}, origins: []string{"https://app.example.com"}, hosts: []string{"codemode.example.com"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := base
			tc.change(&c)
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			b := c.browsers()
			if !slices.Equal(b.Origins, tc.origins) || !slices.Equal(b.Hosts, tc.hosts) {
				t.Fatalf("origins %q hosts %q, want %q %q", b.Origins, b.Hosts, tc.origins, tc.hosts)
			}
		})
	}
	for _, bad := range []Config{
		{AllowedOrigins: []string{"localhost:5173"}},
		{AllowedHosts: []string{"codemode.example.com:443"}},
	} {
		bad.Addr, bad.ControlPlanes = base.Addr, base.ControlPlanes
		if err := bad.Validate(); err == nil {
			t.Errorf("%q %q: Validate passed", bad.AllowedOrigins, bad.AllowedHosts)
		}
	}
}

func TestParseList(t *testing.T) {
	t.Parallel()
	if got := ParseList(" http://a:1, ,https://b ,"); !slices.Equal(got, []string{"http://a:1", "https://b"}) {
		t.Fatalf("got %q", got)
	}
	if got := ParseList(""); got != nil {
		t.Fatalf("empty: got %q", got)
	}
}

// API keys given in the environment work as a keys file does: they make the
// edge keyed, resolve to their tenants, and a bad value is refused.
func TestAPIKeysFromEnvironment(t *testing.T) {
	c := Config{APIKeysJSON: `{"k-alpha-0123456789": "alpha"}`}
	if !c.keyed() {
		t.Error("keys in the environment: not keyed")
	}
	r, err := c.tenants()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := r.Resolve(http.Header{"Authorization": {"Bearer k-alpha-0123456789"}}); err != nil || got != "alpha" {
		t.Errorf("Resolve = %q %v, want alpha", got, err)
	}
	for _, bad := range []string{`{`, `{"short": "alpha"}`, `{"k-alpha-0123456789": "Not A Name"}`} {
		if _, err := (Config{APIKeysJSON: bad}).tenants(); err == nil || !strings.Contains(err.Error(), APIKeysJSONEnv) {
			t.Errorf("%s: %v, want an error naming %s", bad, err, APIKeysJSONEnv)
		}
	}
}
