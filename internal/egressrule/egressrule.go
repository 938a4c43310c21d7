// Package egressrule is what the edge and the agent share about the rules of
// a run's egress (codemode.execution.v1.Egress): which hosts a rule may
// name, whether a rule allows a destination, and how a policy's decision
// narrows a run's egress ([Narrow]).
//
// A rule's host is one of:
//
//   - a name, "api.example.com": that name only;
//   - a wildcard, "*.example.com": every name below example.com, at any depth
//     ("a.example.com", "b.a.example.com"), not example.com itself;
//   - an IP address, "192.0.2.7" or "2001:db8::1";
//   - an address prefix, "192.0.2.0/24" or "2001:db8::/32".
//
// Names compare without regard to case or a trailing dot. A rule's ports
// are the ports it lists, or 80 and 443 when it lists none. Name rules
// match the names a program asks for, address rules match addresses (those
// a program asks for literally, and those a name resolves to); a name rule
// never matches an address, nor an address rule a name.
//
// Everything here is a pure function of its arguments, safe for concurrent
// use; no argument is modified.
package egressrule

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// Bounds of an Egress, as execution.proto's validation rules state them.
const (
	// MaxRules is the most rules an Egress may hold.
	MaxRules = 256
	// MaxPorts is the most ports a rule may list.
	MaxPorts = 32
	// MaxHostLen is the longest host a rule may name, in bytes.
	MaxHostLen = 253
)

// The ports of a rule that lists none.
const (
	DefaultHTTPPort  = 80
	DefaultHTTPSPort = 443
)

// defaultPorts returns the ports of a rule that lists none, as a new slice.
func defaultPorts() []uint32 { return []uint32{DefaultHTTPPort, DefaultHTTPSPort} }

// Rule is a parsed, valid EgressRule. The zero Rule matches nothing.
type Rule struct {
	// name is a lower-case name without a trailing dot: the rule's name,
	// or the domain below which a wildcard matches.
	name     string
	wildcard bool
	// prefix is set for an address (a prefix of the address's length) or
	// an address prefix, masked, with IPv4-mapped IPv6 addresses unmapped.
	prefix netip.Prefix
	// ports are sorted and distinct, never empty.
	ports []uint32
}

// Parse checks an EgressRule and returns it parsed. Its errors name what is
// wrong in terms a tenant's configuration or a policy's author can act on.
func Parse(r *executionv1.EgressRule) (Rule, error) {
	var p Rule
	host, err := parseHost(r.GetHost(), &p)
	if err != nil {
		return Rule{}, err
	}
	ports := r.GetPorts()
	if len(ports) > MaxPorts {
		return Rule{}, fmt.Errorf("host %s: more than %d ports", host, MaxPorts)
	}
	for _, port := range ports {
		if port < 1 || port > 65535 {
			return Rule{}, fmt.Errorf("host %s: port %d is not between 1 and 65535", host, port)
		}
	}
	if len(ports) == 0 {
		p.ports = defaultPorts()
	} else {
		p.ports = slices.Compact(slices.Sorted(slices.Values(ports)))
	}
	return p, nil
}

// parseHost fills p's host from host and returns host as given, for errors.
func parseHost(host string, p *Rule) (string, error) {
	q := strconv.Quote(host)
	switch {
	case host == "":
		return q, errors.New("empty host")
	case len(host) > MaxHostLen:
		return q, fmt.Errorf("host %.40s... is longer than %d bytes", q, MaxHostLen)
	case strings.Contains(host, "/"):
		prefix, err := netip.ParsePrefix(host)
		if err != nil {
			return q, fmt.Errorf("host %s is not an address prefix such as 192.0.2.0/24: %w", q, err)
		}
		p.prefix = canonicalPrefix(prefix)
		return q, nil
	case strings.HasPrefix(host, "*."):
		name, err := checkName(host[2:])
		if err != nil {
			return q, fmt.Errorf("host %s: %w", q, err)
		}
		p.name, p.wildcard = name, true
		return q, nil
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.Zone() != "" {
			return q, fmt.Errorf("host %s: an address rule has no zone", q)
		}
		addr = addr.Unmap()
		p.prefix = netip.PrefixFrom(addr, addr.BitLen())
		return q, nil
	}
	if strings.HasPrefix(host, "[") {
		return q, fmt.Errorf("host %s: write an IPv6 address without brackets", q)
	}
	if strings.Contains(host, ":") {
		if h, port, err := splitHostPort(host); err == nil {
			return q, fmt.Errorf("host %s names port %s: write the host %q and list the port in ports", q, port, h)
		}
		return q, fmt.Errorf("host %s is not an IP address", q)
	}
	name, err := checkName(host)
	if err != nil {
		return q, fmt.Errorf("host %s: %w", q, err)
	}
	p.name = name
	return q, nil
}

func splitHostPort(s string) (host, port string, err error) {
	i := strings.LastIndexByte(s, ':')
	host, port = s[:i], s[i+1:]
	if _, err := strconv.ParseUint(port, 10, 16); err != nil || host == "" || strings.Contains(host, ":") {
		return "", "", errors.New("not host:port")
	}
	return host, port, nil
}

// canonicalPrefix masks p and unmaps an IPv4-mapped IPv6 prefix that holds
// only mapped addresses.
func canonicalPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// checkName checks a DNS name (no wildcard) and returns it in lower case
// without its trailing dot.
func checkName(s string) (string, error) {
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return "", errors.New("empty name")
	}
	if len(s) > MaxHostLen {
		return "", fmt.Errorf("name longer than %d bytes", MaxHostLen)
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		switch {
		case l == "":
			return "", errors.New("empty label (two dots in a row, or a leading dot)")
		case len(l) > 63:
			return "", fmt.Errorf("label %.20q... is longer than 63 bytes", l)
		case l[0] == '-' || l[len(l)-1] == '-':
			return "", fmt.Errorf("label %q starts or ends with a hyphen", l)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				if c == '*' {
					return "", errors.New("a wildcard may only be the whole first label, as in *.example.com")
				}
				return "", fmt.Errorf("label %q holds %q: names are letters, digits, hyphens and underscores (write other names in punycode)", l, c)
			}
		}
	}
	if last := labels[len(labels)-1]; strings.Trim(last, "0123456789") == "" {
		return "", fmt.Errorf("last label %q is all digits: not a name, and not an IP address either", last)
	}
	return strings.ToLower(s), nil
}

// Validate reports whether r is a rule a tenant's configuration or a
// policy's decision may hold: a host of one of the four forms (see the
// package doc) with valid DNS labels, or a valid address or prefix, and at
// most [MaxPorts] ports between 1 and 65535.
func Validate(r *executionv1.EgressRule) error {
	_, err := Parse(r)
	return err
}

// ValidateEgress validates every rule of e (see [Validate]), their number
// and e's limits. A nil e is valid (it allows nothing).
func ValidateEgress(e *executionv1.Egress) error {
	if n := len(e.GetAllow()); n > MaxRules {
		return fmt.Errorf("%d rules, more than %d", n, MaxRules)
	}
	for i, r := range e.GetAllow() {
		if err := Validate(r); err != nil {
			return fmt.Errorf("rule %d: %w", i, err)
		}
	}
	if t := e.GetLimits().GetConnectionTime(); t != nil {
		if err := t.CheckValid(); err != nil {
			return fmt.Errorf("limits: connection_time: %w", err)
		}
		if t.AsDuration() < 0 {
			return errors.New("limits: connection_time is negative")
		}
	}
	return nil
}

// Host returns the rule's host in canonical form: a name in lower case
// without a trailing dot, "*." and such a name, an address (IPv4-mapped
// ones as IPv4), or a masked prefix.
func (r Rule) Host() string {
	switch {
	case r.prefix.IsValid() && r.prefix.IsSingleIP():
		return r.prefix.Addr().String()
	case r.prefix.IsValid():
		return r.prefix.String()
	case r.wildcard:
		return "*." + r.name
	}
	return r.name
}

// Ports returns the rule's ports, sorted; 80 and 443 when the rule listed
// none.
func (r Rule) Ports() []uint32 { return slices.Clone(r.ports) }

// Proto returns the rule as a new EgressRule in canonical form (see
// [Rule.Host]); ports 80 and 443 are written as none.
func (r Rule) Proto() *executionv1.EgressRule {
	out := &executionv1.EgressRule{Host: r.Host()}
	if !slices.Equal(r.ports, defaultPorts()) {
		out.Ports = slices.Clone(r.ports)
	}
	return out
}

// String returns the rule as "host:port,port", with an IPv6 host in
// brackets.
func (r Rule) String() string {
	host := r.Host()
	if r.prefix.IsValid() && r.prefix.Addr().Is6() {
		host = "[" + host + "]"
	}
	ports := make([]string, len(r.ports))
	for i, p := range r.ports {
		ports[i] = strconv.FormatUint(uint64(p), 10)
	}
	return host + ":" + strings.Join(ports, ",")
}

// port reports whether the rule allows port.
func (r Rule) port(port uint32) bool {
	_, ok := slices.BinarySearch(r.ports, port)
	return ok
}

// MatchHost reports whether the rule allows a connection to host on port,
// where host is what a program asked for: a name (any case, a trailing dot
// allowed) or an address literal (an IPv6 one with or without brackets).
// A name matches name rules only, an address literal address rules only.
// A host that is neither a valid name nor an address matches nothing.
func (r Rule) MatchHost(host string, port uint32) bool {
	if !r.port(port) {
		return false
	}
	if addr, ok := parseAddr(host); ok {
		return r.prefix.IsValid() && r.prefix.Contains(addr)
	}
	if r.prefix.IsValid() || r.name == "" {
		return false
	}
	name, err := checkName(host)
	if err != nil {
		return false
	}
	if r.wildcard {
		return below(name, r.name)
	}
	return name == r.name
}

// below reports whether name is strictly below domain ("a.example.com" is
// below "example.com", "example.com" is not).
func below(name, domain string) bool {
	return len(name) > len(domain)+1 && name[len(name)-len(domain)-1] == '.' && strings.HasSuffix(name, domain)
}

// MatchAddr reports whether the rule is an address rule that allows a
// connection to addr on port. An IPv4-mapped IPv6 addr counts as IPv4; a
// zone is ignored.
func (r Rule) MatchAddr(addr netip.Addr, port uint32) bool {
	return r.prefix.IsValid() && r.port(port) && r.prefix.Contains(addr.WithZone("").Unmap())
}

// parseAddr parses an address literal, with or without brackets.
func parseAddr(host string) (netip.Addr, bool) {
	if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	addr, err := netip.ParseAddr(host)
	if err != nil || addr.Zone() != "" {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}

// MatchHost reports whether rule allows a connection to host on port (see
// [Rule.MatchHost]). A malformed rule matches nothing. Callers matching many
// connections against the same rules can [Parse] them once instead.
func MatchHost(rule *executionv1.EgressRule, host string, port uint32) bool {
	r, err := Parse(rule)
	return err == nil && r.MatchHost(host, port)
}

// MatchAddr reports whether rule is an address rule that allows a
// connection to addr on port (see [Rule.MatchAddr]). A malformed rule
// matches nothing.
func MatchAddr(rule *executionv1.EgressRule, addr netip.Addr, port uint32) bool {
	r, err := Parse(rule)
	return err == nil && r.MatchAddr(addr, port)
}

// within reports whether every destination r allows by host is one o
// allows by host (ports aside).
func (r Rule) within(o Rule) bool {
	switch {
	case r.prefix.IsValid() || o.prefix.IsValid():
		return r.prefix.IsValid() && o.prefix.IsValid() &&
			o.prefix.Bits() <= r.prefix.Bits() && o.prefix.Contains(r.prefix.Addr())
	case o.wildcard:
		return below(r.name, o.name) || r.wildcard && r.name == o.name
	default:
		return !r.wildcard && r.name == o.name
	}
}
