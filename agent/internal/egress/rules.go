package egress

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// defaultPorts are a rule's ports when it names none.
var defaultPorts = []uint32{80, 443}

// rule is a parsed EgressRule.
type rule struct {
	name   string       // an exact name, lower case, without a trailing dot
	suffix string       // ".example.com" for "*.example.com"
	prefix netip.Prefix // an address or address prefix rule, if valid
	ports  []uint32
}

func parseRule(r *executionv1.EgressRule) (rule, error) {
	p := rule{ports: r.GetPorts()}
	if len(p.ports) == 0 {
		p.ports = defaultPorts
	}
	h := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(r.GetHost())), ".")
	switch {
	case h == "":
		return rule{}, fmt.Errorf("empty host")
	case strings.Contains(h, "/"):
		pre, err := netip.ParsePrefix(h)
		if err != nil {
			return rule{}, fmt.Errorf("bad address prefix %q: %w", h, err)
		}
		p.prefix = pre.Masked()
	case strings.HasPrefix(h, "*."):
		p.suffix = h[1:]
		if !validName(p.suffix[1:]) {
			return rule{}, fmt.Errorf("bad name pattern %q", h)
		}
	default:
		if a, err := netip.ParseAddr(h); err == nil {
			a = a.Unmap()
			p.prefix = netip.PrefixFrom(a, a.BitLen())
		} else if validName(h) {
			p.name = h
		} else {
			return rule{}, fmt.Errorf("bad host %q", h)
		}
	}
	return p, nil
}

func validName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

func (r rule) port(p uint32) bool { return slices.Contains(r.ports, p) }

// matchHost reports whether r allows host, a lower-case name or an address
// literal, on port.
func (r rule) matchHost(host string, port uint32) bool {
	if !r.port(port) {
		return false
	}
	if r.prefix.IsValid() {
		a, err := netip.ParseAddr(host)
		return err == nil && r.prefix.Contains(a.Unmap())
	}
	if r.suffix != "" {
		return len(host) > len(r.suffix) && strings.HasSuffix(host, r.suffix)
	}
	return host == r.name
}

// matchAddr reports whether r is an address rule that allows a on port.
func (r rule) matchAddr(a netip.Addr, port uint32) bool {
	return r.prefix.IsValid() && r.port(port) && r.prefix.Contains(a)
}
