package egressrule

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

func egress(rules ...*executionv1.EgressRule) *executionv1.Egress {
	return &executionv1.Egress{Allow: rules}
}

// rules writes an Egress's rules as "host:ports" strings, ports omitted
// when the rule lists none.
func rules(e *executionv1.Egress) []string {
	var out []string
	for _, r := range e.GetAllow() {
		s := r.Host
		if len(r.Ports) > 0 {
			s += fmt.Sprint(r.Ports)
		}
		out = append(out, s)
	}
	return out
}

func TestNarrow(t *testing.T) {
	t.Parallel()
	github := egress(rule("api.github.com"), rule("*.githubusercontent.com", 443), rule("192.0.2.0/24", 443, 8443))
	for _, tc := range []struct {
		name          string
		base, decided *executionv1.Egress
		want          []string
		dropped       []string
	}{
		{
			name: "nothing decided keeps everything",
			base: github, decided: egress(),
			want: nil,
		},
		{
			name: "keeps a rule of base",
			base: github, decided: egress(rule("api.github.com")),
			want: []string{"api.github.com"},
		},
		{
			name: "a wildcard is narrowed to the base's name",
			base: egress(rule("api.github.com")), decided: egress(rule("*.com")),
			want:    []string{"api.github.com"},
			dropped: []string{"*.com:80,443"},
		},
		{
			name: "a wildcard does not cover its own domain",
			base: egress(rule("github.com")), decided: egress(rule("*.github.com")),
			want:    nil,
			dropped: []string{"*.github.com:80,443"},
		},
		{
			name: "a name below a base wildcard is kept",
			base: github, decided: egress(rule("raw.githubusercontent.com", 443)),
			want: []string{"raw.githubusercontent.com[443]"},
		},
		{
			name: "a name below a base wildcard gets the base's ports",
			base: github, decided: egress(rule("raw.githubusercontent.com")),
			want:    []string{"raw.githubusercontent.com[443]"},
			dropped: []string{"raw.githubusercontent.com:80,443"},
		},
		{
			name: "ports outside the base's are dropped",
			base: github, decided: egress(rule("api.github.com", 22, 443, 8080)),
			want:    []string{"api.github.com[443]"},
			dropped: []string{"api.github.com:22,443,8080"},
		},
		{
			name: "no port in common drops the rule",
			base: github, decided: egress(rule("api.github.com", 22)),
			want:    nil,
			dropped: []string{"api.github.com:22"},
		},
		{
			name: "a narrower wildcard within the base's",
			base: github, decided: egress(rule("*.cdn.githubusercontent.com")),
			want:    []string{"*.cdn.githubusercontent.com[443]"},
			dropped: []string{"*.cdn.githubusercontent.com:80,443"},
		},
		{
			name: "names are compared without case or trailing dot",
			base: github, decided: egress(rule("API.GitHub.com.")),
			want: []string{"api.github.com"},
		},
		{
			name: "an address within the base's prefix",
			base: github, decided: egress(rule("192.0.2.7", 443)),
			want: []string{"192.0.2.7[443]"},
		},
		{
			name: "a prefix wider than the base's is narrowed to it",
			base: github, decided: egress(rule("192.0.0.0/16")),
			want:    []string{"192.0.2.0/24[443]"},
			dropped: []string{"192.0.0.0/16:80,443"},
		},
		{
			name: "everything is narrowed to the base",
			base: github, decided: egress(rule("0.0.0.0/0", 443, 8443), rule("::/0"), rule("*.com", 443)),
			want:    []string{"192.0.2.0/24[443 8443]", "api.github.com[443]", "*.githubusercontent.com[443]"},
			dropped: []string{"0.0.0.0/0:443,8443", "[::/0]:80,443", "*.com:443"},
		},
		{
			name: "a prefix outside the base's",
			base: github, decided: egress(rule("198.51.100.0/24", 443)),
			want:    nil,
			dropped: []string{"198.51.100.0/24:443"},
		},
		{
			name: "an address never matches a name",
			base: egress(rule("example.com")), decided: egress(rule("93.184.215.14")),
			want:    nil,
			dropped: []string{"93.184.215.14:80,443"},
		},
		{
			name: "ipv4 and ipv6 do not mix",
			base: egress(rule("192.0.2.0/24")), decided: egress(rule("::ffff:192.0.2.0/120"), rule("::/0")),
			want:    []string{"192.0.2.0/24"},
			dropped: []string{"[::/0]:80,443"},
		},
		{
			name: "duplicates merge and covered rules go",
			base: egress(rule("*.example.com")),
			decided: egress(rule("a.example.com", 80), rule("a.example.com", 443), rule("*.example.com", 443),
				rule("b.example.com", 443), rule("*.b.example.com", 443)),
			want: []string{"a.example.com", "*.example.com[443]"},
		},
		{
			name:    "several base rules for one decided rule",
			base:    egress(rule("a.example.com", 443), rule("b.example.com", 8443), rule("c.example.org")),
			decided: egress(rule("*.example.com", 443, 8443)),
			want:    []string{"a.example.com[443]", "b.example.com[8443]"},
			dropped: []string{"*.example.com:443,8443"},
		},
		{
			name:    "base ports split over two rules still allow the whole",
			base:    egress(rule("*.example.com", 80), rule("*.example.com", 443)),
			decided: egress(rule("api.example.com")),
			want:    []string{"api.example.com"},
		},
		{
			name: "a malformed decided rule is dropped",
			base: github, decided: egress(rule("api..github.com"), rule("api.github.com")),
			want:    []string{"api.github.com"},
			dropped: []string{`invalid rule: host "api..github.com": empty label (two dots in a row, or a leading dot)`},
		},
		{
			name: "a malformed base rule allows nothing",
			base: egress(rule("*.*.com")), decided: egress(rule("a.b.com")),
			want:    nil,
			dropped: []string{"a.b.com:80,443"},
		},
		{
			name: "no base allows nothing",
			base: nil, decided: egress(rule("api.github.com")),
			want:    nil,
			dropped: []string{"api.github.com:80,443"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			before, beforeDecided := proto.Clone(tc.base), proto.Clone(tc.decided)
			got, dropped := Narrow(tc.base, tc.decided)
			if !slices.Equal(rules(got), tc.want) {
				t.Errorf("rules = %q, want %q", rules(got), tc.want)
			}
			if !slices.Equal(dropped, tc.dropped) {
				t.Errorf("dropped = %q, want %q", dropped, tc.dropped)
			}
			if got == nil {
				t.Errorf("Narrow returned nil for a set decision: that would mean unchanged to a caller that passes it on")
			}
			if !proto.Equal(tc.base, before) || !proto.Equal(tc.decided, beforeDecided) {
				t.Errorf("Narrow modified its arguments")
			}
			if err := ValidateEgress(got); err != nil {
				t.Errorf("result is not valid: %v", err)
			}
		})
	}
}

func TestNarrowUnsetKeepsBase(t *testing.T) {
	t.Parallel()
	base := egress(rule("api.github.com"))
	if got, dropped := Narrow(base, nil); got != base || dropped != nil {
		t.Errorf("Narrow(base, nil) = %v, %v; want base itself", got, dropped)
	}
	if got, _ := Narrow(nil, nil); got != nil {
		t.Errorf("Narrow(nil, nil) = %v, want nil", got)
	}
}

func TestNarrowLimits(t *testing.T) {
	t.Parallel()
	lim := func(conns uint32, bytes uint64, d time.Duration) *executionv1.EgressLimits {
		l := &executionv1.EgressLimits{Connections: conns, Bytes: bytes}
		if d != 0 {
			l.ConnectionTime = durationpb.New(d)
		}
		return l
	}
	for _, tc := range []struct {
		name          string
		base, decided *executionv1.EgressLimits
		want          *executionv1.EgressLimits
	}{
		{"none", nil, nil, nil},
		{"base only", lim(10, 1000, time.Minute), nil, lim(10, 1000, time.Minute)},
		{"decided only lowers the defaults", nil, lim(5, 0, time.Second), lim(5, 0, time.Second)},
		{"lower wins", lim(10, 1000, time.Minute), lim(20, 500, time.Second), lim(10, 500, time.Second)},
		{"zero keeps the base's", lim(10, 1000, time.Minute), lim(0, 0, 0), lim(10, 1000, time.Minute)},
		{"a negative time is no opinion", lim(0, 0, time.Minute), &executionv1.EgressLimits{ConnectionTime: durationpb.New(-time.Hour)}, lim(0, 0, time.Minute)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, _ := Narrow(&executionv1.Egress{Limits: tc.base}, &executionv1.Egress{Limits: tc.decided})
			if !proto.Equal(got.GetLimits(), tc.want) {
				t.Errorf("limits = %v, want %v", got.GetLimits(), tc.want)
			}
		})
	}
}

func TestNarrowCapsRules(t *testing.T) {
	t.Parallel()
	// Each side's names lie below the other's wildcard: the intersection
	// holds all of them, more than an Egress may.
	base, decided := egress(rule("*.y.example")), egress(rule("*.x.example"))
	for i := range 200 {
		base.Allow = append(base.Allow, rule(fmt.Sprintf("b%d.x.example", i)))
		decided.Allow = append(decided.Allow, rule(fmt.Sprintf("d%d.y.example", i)))
	}
	got, dropped := Narrow(base, decided)
	if len(got.Allow) != MaxRules {
		t.Fatalf("%d rules, want %d", len(got.Allow), MaxRules)
	}
	if n := len(dropped); n != 400-MaxRules+1 || !strings.HasSuffix(dropped[n-1], "(past 256 rules)") {
		t.Errorf("dropped = %d: %q, want the wildcard and %d past the cap", n, dropped[max(0, n-2):], 400-MaxRules)
	}
}

// allows reports whether e allows a connection to host on port: a name or
// address literal, or a resolved address when addr is valid.
func allows(e *executionv1.Egress, host string, addr netip.Addr, port uint32) bool {
	for _, r := range e.GetAllow() {
		if addr.IsValid() && MatchAddr(r, addr, port) || !addr.IsValid() && MatchHost(r, host, port) {
			return true
		}
	}
	return false
}

// FuzzNarrowIsIntersection checks that the result of Narrow allows exactly
// what both its arguments allow, on probes around every host they name.
func FuzzNarrowIsIntersection(f *testing.F) {
	f.Add("*.github.com:443 api.github.com 192.0.2.0/24:443,8443", "*.com a.b.github.com:22,443 192.0.0.0/16 192.0.2.9:8443")
	f.Add("*.example.com:80 *.example.com:443", "api.example.com *.a.example.com:443 example.com")
	// Private addresses, built rather than written: rules only, never dialed.
	p := func(b ...byte) string { return netip.AddrFrom4([4]byte(b)).String() }
	f.Add("2001:db8::/32 "+p(10, 0, 0, 0)+"/8:5432", "::/0 "+p(10, 1, 2, 3)+":5432,5433 ::ffff:"+p(10, 0, 0, 1))
	f.Fuzz(checkIntersection)
}

func checkIntersection(t *testing.T, baseSpec, decidedSpec string) {
	base, decided := parseSpec(baseSpec), parseSpec(decidedSpec)
	if len(base.Allow) > 16 || len(decided.Allow) > 16 {
		return // the probes below grow with the square of the rules
	}
	got, _ := Narrow(base, decided)
	if len(got.GetAllow()) == MaxRules {
		return // possibly cut short
	}
	var hosts []string
	for _, e := range []*executionv1.Egress{base, decided, got} {
		for _, r := range e.GetAllow() {
			hosts = append(hosts, r.Host)
		}
	}
	for _, h := range hosts {
		for _, probe := range probes(h) {
			for _, port := range []uint32{22, 80, 443, 5432, 8443} {
				want := allows(base, probe.host, probe.addr, port) && allows(decided, probe.host, probe.addr, port)
				if have := allows(got, probe.host, probe.addr, port); have != want {
					t.Fatalf("Narrow(%q, %q) = %q allows %q %v port %d: %v, want %v",
						baseSpec, decidedSpec, rules(got), probe.host, probe.addr, port, have, want)
				}
			}
		}
	}
}

// parseSpec reads "host:port,port host ..." into an Egress (IPv6 hosts take
// no ports).
func parseSpec(s string) *executionv1.Egress {
	e := &executionv1.Egress{}
	for _, f := range strings.Fields(s) {
		host, ports, _ := strings.Cut(f, ":")
		if strings.Count(f, ":") > 1 {
			host, ports = f, ""
		}
		r := &executionv1.EgressRule{Host: host}
		for _, p := range strings.Split(ports, ",") {
			var n uint32
			if _, err := fmt.Sscan(p, &n); err == nil {
				r.Ports = append(r.Ports, n)
			}
		}
		e.Allow = append(e.Allow, r)
	}
	return e
}

type probe struct {
	host string
	addr netip.Addr
}

// probes returns destinations at the edges of a host: a wildcard's domain,
// names just below it and deeper; a prefix's first and last addresses and
// the ones just outside.
func probes(host string) []probe {
	if p, err := netip.ParsePrefix(host); err == nil {
		p = p.Masked()
		first, last := p.Addr(), lastAddr(p)
		out := []probe{{addr: first}, {addr: last}, {host: first.String()}}
		if a := first.Prev(); a.IsValid() {
			out = append(out, probe{addr: a})
		}
		if a := last.Next(); a.IsValid() {
			out = append(out, probe{addr: a})
		}
		return out
	}
	if a, err := netip.ParseAddr(host); err == nil {
		out := []probe{{addr: a}, {host: host}}
		if a.Next().IsValid() {
			out = append(out, probe{addr: a.Next()})
		}
		return out
	}
	name := strings.TrimPrefix(host, "*.")
	return []probe{{host: name}, {host: "a." + name}, {host: "b.a." + name}, {host: "x" + name}}
}

// lastAddr returns the last address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := range b {
		if bits := p.Bits() - 8*i; bits < 8 {
			b[i] |= 0xff >> max(bits, 0)
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
