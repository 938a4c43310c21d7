package egressrule

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

func rule(host string, ports ...uint32) *executionv1.EgressRule {
	return &executionv1.EgressRule{Host: host, Ports: ports}
}

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, host string
		ports      []uint32
		wantHost   string   // canonical
		wantPorts  []uint32 // nil: 80, 443
	}{
		{"name", "api.github.com", nil, "api.github.com", nil},
		{"case and trailing dot", "API.GitHub.com.", nil, "api.github.com", nil},
		{"wildcard", "*.Example.COM", []uint32{443}, "*.example.com", []uint32{443}},
		{"single label", "localhost", nil, "localhost", nil},
		{"underscore", "_acme.example.com", nil, "_acme.example.com", nil},
		{"digits inside", "123.example.com", nil, "123.example.com", nil},
		{"api name", "github.api.codemode", nil, "github.api.codemode", nil},
		{"ipv4", "192.0.2.7", nil, "192.0.2.7", nil},
		{"ipv6", "2001:DB8::1", nil, "2001:db8::1", nil},
		{"ipv4-mapped", "::ffff:192.0.2.7", nil, "192.0.2.7", nil},
		{"prefix", "192.0.2.0/24", nil, "192.0.2.0/24", nil},
		{"prefix masked", "192.0.2.7/24", nil, "192.0.2.0/24", nil},
		{"prefix /32 is an address", "192.0.2.7/32", nil, "192.0.2.7", nil},
		{"ipv6 prefix", "2001:db8::/32", nil, "2001:db8::/32", nil},
		{"ipv4-mapped prefix", "::ffff:192.0.2.0/120", nil, "192.0.2.0/24", nil},
		{"everything", "0.0.0.0/0", nil, "0.0.0.0/0", nil},
		{"ports sorted and distinct", "a.example", []uint32{8443, 443, 8443}, "a.example", []uint32{443, 8443}},
		{"default ports written as none", "a.example", []uint32{443, 80}, "a.example", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := Parse(rule(tc.host, tc.ports...))
			if err != nil {
				t.Fatalf("Parse(%q) = %v", tc.host, err)
			}
			got := r.Proto()
			if got.Host != tc.wantHost || !slices.Equal(got.Ports, tc.wantPorts) {
				t.Errorf("Parse(%q, %v) = %q %v, want %q %v", tc.host, tc.ports, got.Host, got.Ports, tc.wantHost, tc.wantPorts)
			}
		})
	}
}

func TestValidateRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, host string
		ports      []uint32
		want       string // in the error
	}{
		{"empty", "", nil, "empty host"},
		{"too long", strings.Repeat("a.", 127) + "com", nil, "longer than 253"},
		{"empty label", "a..example.com", nil, "empty label"},
		{"leading dot", ".example.com", nil, "empty label"},
		{"two trailing dots", "example.com..", nil, "empty label"},
		{"long label", strings.Repeat("a", 64) + ".com", nil, "longer than 63"},
		{"leading hyphen", "-a.example.com", nil, "hyphen"},
		{"trailing hyphen", "a-.example.com", nil, "hyphen"},
		{"space", "exa mple.com", nil, "letters, digits"},
		{"unicode", "bücher.example", nil, "punycode"},
		{"nul", "evil.com\x00.github.com", nil, "letters, digits"},
		{"wildcard inside", "a.*.example.com", nil, "whole first label"},
		{"two wildcards", "*.*.example.com", nil, "whole first label"},
		{"wildcard alone", "*.", nil, "empty name"},
		{"bare star", "*", nil, "whole first label"},
		{"partial wildcard", "a*.example.com", nil, "whole first label"},
		{"numeric last label", "1.2.3", nil, "all digits"},
		{"octal-looking address", "0177.0.0.1", nil, "all digits"},
		{"wildcard over numbers", "*.0.0.1", nil, "all digits"},
		{"port in host", "example.com:443", nil, `list the port in ports`},
		{"address with port", "192.0.2.7:443", nil, `list the port in ports`},
		{"bad ipv6", "2001:db8:::1", nil, "not an IP address"},
		{"zone", "fe80::1%eth0", nil, "zone"},
		{"bad prefix", "192.0.2.0/33", nil, "not an address prefix"},
		{"name prefix", "example.com/24", nil, "not an address prefix"},
		{"brackets", "[2001:db8::1]", nil, "without brackets"},
		{"port zero", "example.com", []uint32{0}, "port 0"},
		{"port too big", "example.com", []uint32{65536}, "port 65536"},
		{"too many ports", "example.com", seq(1, 33), "more than 32 ports"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := Validate(rule(tc.host, tc.ports...))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate(%q, %v) = %v, want an error about %q", tc.host, tc.ports, err, tc.want)
			}
		})
	}
}

func seq(from, n uint32) []uint32 {
	var s []uint32
	for i := range n {
		s = append(s, from+i)
	}
	return s
}

func TestValidateEgress(t *testing.T) {
	t.Parallel()
	many := &executionv1.Egress{}
	for range MaxRules + 1 {
		many.Allow = append(many.Allow, rule("example.com"))
	}
	for _, tc := range []struct {
		name string
		e    *executionv1.Egress
		want string // "": valid
	}{
		{"nil", nil, ""},
		{"empty", &executionv1.Egress{}, ""},
		{"rules and limits", &executionv1.Egress{Allow: []*executionv1.EgressRule{rule("*.example.com", 443)},
			Limits: &executionv1.EgressLimits{Connections: 3, ConnectionTime: durationpb.New(time.Second)}}, ""},
		{"bad rule", &executionv1.Egress{Allow: []*executionv1.EgressRule{rule("a.example"), rule("a..example")}}, "rule 1: "},
		{"too many rules", many, "more than 256"},
		{"negative connection time", &executionv1.Egress{Limits: &executionv1.EgressLimits{ConnectionTime: durationpb.New(-time.Second)}}, "negative"},
		{"malformed connection time", &executionv1.Egress{Limits: &executionv1.EgressLimits{ConnectionTime: &durationpb.Duration{Seconds: 1, Nanos: -1}}}, "connection_time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := ValidateEgress(tc.e)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("ValidateEgress = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestMatchHost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rule *executionv1.EgressRule
		host string
		port uint32
		want bool
	}{
		{rule("api.github.com"), "api.github.com", 443, true},
		{rule("api.github.com"), "api.github.com", 80, true},
		{rule("api.github.com"), "api.github.com", 22, false},
		{rule("api.github.com"), "API.GITHUB.COM.", 443, true},
		{rule("api.github.com"), "github.com", 443, false},
		{rule("api.github.com"), "x.api.github.com", 443, false},
		{rule("api.github.com", 8443), "api.github.com", 443, false},
		{rule("api.github.com", 8443), "api.github.com", 8443, true},
		{rule("*.github.com"), "api.github.com", 443, true},
		{rule("*.github.com"), "a.b.github.com", 443, true},
		{rule("*.github.com"), "github.com", 443, false},
		{rule("*.github.com"), "evilgithub.com", 443, false},
		{rule("*.github.com"), "github.com.evil.com", 443, false},
		{rule("*.github.com"), "evil.com\x00.github.com", 443, false},
		{rule("*.github.com"), "*.github.com", 443, false},
		{rule("*.github.com"), "a..github.com", 443, false},
		{rule("*.github.com"), "", 443, false},
		// Address literals match address rules only.
		{rule("192.0.2.0/24"), "192.0.2.7", 443, true},
		{rule("192.0.2.0/24"), "192.0.3.7", 443, false},
		{rule("192.0.2.7"), "::ffff:192.0.2.7", 443, true},
		{rule("2001:db8::/32"), "[2001:db8::1]", 443, true},
		{rule("2001:db8::/32"), "2001:db8::1", 80, true},
		{rule("2001:db8::/32"), "2001:db9::1", 80, false},
		{rule("*.2.7"), "192.0.2.7", 443, false}, // malformed rule
		{rule("example.com"), "93.184.215.14", 443, false},
		{rule("192.0.2.7"), "host.example", 443, false},
		// A malformed rule matches nothing.
		{rule("a..b"), "a..b", 443, false},
		{rule("example.com", 0), "example.com", 0, false},
	} {
		if got := MatchHost(tc.rule, tc.host, tc.port); got != tc.want {
			t.Errorf("MatchHost(%q %v, %q, %d) = %v, want %v", tc.rule.Host, tc.rule.Ports, tc.host, tc.port, got, tc.want)
		}
	}
}

func TestMatchAddr(t *testing.T) {
	t.Parallel()
	a := netip.MustParseAddr
	for _, tc := range []struct {
		rule *executionv1.EgressRule
		addr netip.Addr
		port uint32
		want bool
	}{
		{rule("192.0.2.0/24"), a("192.0.2.200"), 443, true},
		{rule("192.0.2.0/24"), a("192.0.2.200"), 8080, false},
		{rule("192.0.2.0/24", 8080), a("192.0.2.200"), 8080, true},
		{rule("192.0.2.0/24"), a("192.0.3.1"), 443, false},
		{rule("192.0.2.0/24"), a("::ffff:192.0.2.1"), 443, true},
		{rule("192.0.2.7"), a("192.0.2.7"), 80, true},
		{rule("192.0.2.7"), a("192.0.2.8"), 80, false},
		{rule("fe80::/10"), a("fe80::1%eth0"), 443, true},
		{rule("0.0.0.0/0"), a("2001:db8::1"), 443, false},
		{rule("::/0"), a("2001:db8::1"), 443, true},
		// Name rules never match an address.
		{rule("*.example.com"), a("192.0.2.7"), 443, false},
		{rule("localhost"), a("127.0.0.1"), 80, false},
	} {
		if got := MatchAddr(tc.rule, tc.addr, tc.port); got != tc.want {
			t.Errorf("MatchAddr(%q %v, %v, %d) = %v, want %v", tc.rule.Host, tc.rule.Ports, tc.addr, tc.port, got, tc.want)
		}
	}
}

func TestRuleString(t *testing.T) {
	t.Parallel()
	for host, want := range map[string]string{
		"Example.com":   "example.com:80,443",
		"2001:db8::/32": "[2001:db8::/32]:80,443",
		"192.0.2.7":     "192.0.2.7:80,443",
	} {
		r, err := Parse(rule(host))
		if err != nil {
			t.Fatal(err)
		}
		if r.String() != want {
			t.Errorf("Parse(%q).String() = %q, want %q", host, r.String(), want)
		}
	}
}

// FuzzParse checks that no host makes Parse panic, that a parsed rule's
// canonical form parses to itself, and that a rule matches its own name.
func FuzzParse(f *testing.F) {
	for _, h := range []string{"api.github.com", "*.Example.com.", "192.0.2.7/24", "::ffff:1.2.3.4", "a..b", "*.*", "fe80::1%x", "x:1"} {
		f.Add(h, uint32(443))
	}
	f.Fuzz(func(t *testing.T, host string, port uint32) {
		r, err := Parse(rule(host, port))
		if err != nil {
			return
		}
		again, err := Parse(r.Proto())
		if err != nil || again.Host() != r.Host() || !slices.Equal(again.ports, r.ports) {
			t.Fatalf("canonical form %v of %q does not parse to itself: %v", r.Proto(), host, err)
		}
		if !r.prefix.IsValid() && !r.wildcard && !r.MatchHost(r.Host(), port) {
			t.Fatalf("rule %q does not match its own name on port %d", host, port)
		}
	})
}
