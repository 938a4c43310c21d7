// Command egress is a request-phase policy that narrows, per tenant, what
// runs may reach outside their sandboxes, and can keep a tenant's API tool
// calls read-only.
//
// Its configuration has one line per tenant, "tenant: directive, ..."; the
// tenant "*" is the line for every tenant without its own. A tenant with no
// line and no "*" line, or a line without directives, is left alone. Lines
// starting with "#" are comments. For example:
//
//	*: https-only, no-wildcards, connections 16
//	acme: https-only
//	ci-bot: https-only, read-only-apis
//	partner:
//
// Directives:
//
//   - https-only: keep only port 443 of every destination, so that nothing
//     goes out in clear text. The edge's configured APIs (names ending in
//     ".api.codemode") keep their ports: the agent forwards those to the API
//     itself, over TLS, with the API's credential.
//   - no-wildcards: drop "*.domain" rules and address prefixes, so that only
//     destinations named one by one remain.
//   - connections N: at most N connections per run.
//   - read-only-apis: deny API tool calls whose method is not GET or HEAD.
//
// A decision that narrows egress carries the annotation "egress", for
// example "kept 3 of 6 rules (https-only, no-wildcards)". The policy only
// ever takes egress away; the edge would narrow anything more it asked for
// to the tenant's configuration anyway.
package main

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/codemode-go/codemode/policies/sdk"
)

// rules is what one configuration line says.
type rules struct {
	httpsOnly, noWildcards, readOnlyAPIs bool
	connections                          uint32
	// names lists the directives that narrow egress, for the annotation.
	names string
}

var byTenant map[string]rules

func init() {
	sdk.HandleInit(func(config []byte) error {
		byTenant = make(map[string]rules)
		for i, line := range strings.Split(string(config), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			tenant, directives, ok := strings.Cut(line, ":")
			if !ok {
				return fmt.Errorf("line %d: want \"tenant: directive, ...\"", i+1)
			}
			var r rules
			var names []string
			for _, d := range strings.Split(directives, ",") {
				f := strings.Fields(d)
				switch {
				case len(f) == 0:
				case len(f) == 1 && f[0] == "https-only":
					r.httpsOnly = true
					names = append(names, f[0])
				case len(f) == 1 && f[0] == "no-wildcards":
					r.noWildcards = true
					names = append(names, f[0])
				case len(f) == 1 && f[0] == "read-only-apis":
					r.readOnlyAPIs = true
				case len(f) == 2 && f[0] == "connections":
					n, err := strconv.ParseUint(f[1], 10, 32)
					if err != nil || n == 0 {
						return fmt.Errorf("line %d: connections wants a positive number, not %q", i+1, f[1])
					}
					r.connections = uint32(n)
					names = append(names, "connections "+f[1])
				default:
					return fmt.Errorf("line %d: unknown directive %q (want https-only, no-wildcards, connections N or read-only-apis)", i+1, strings.TrimSpace(d))
				}
			}
			r.names = strings.Join(names, ", ")
			byTenant[strings.TrimSpace(tenant)] = r
		}
		return nil
	})
	sdk.HandleRequest(func(in *sdk.RequestInput) sdk.RequestDecision {
		r, ok := byTenant[in.Tenant]
		if !ok {
			if r, ok = byTenant["*"]; !ok {
				return sdk.Allow()
			}
		}
		if c := in.APICall; c != nil && r.readOnlyAPIs && !strings.EqualFold(c.Method, "GET") && !strings.EqualFold(c.Method, "HEAD") {
			return sdk.Deny("tenant " + in.Tenant + " may only read through API tools; " + c.Tool + " is a " + c.Method)
		}
		if r.names == "" {
			return sdk.Allow()
		}
		egress := &sdk.Egress{Limits: sdk.EgressLimits{Connections: r.connections}}
		for _, rule := range in.Egress.Allow {
			if r.noWildcards && (strings.HasPrefix(rule.Host, "*.") || strings.Contains(rule.Host, "/")) {
				continue
			}
			if r.httpsOnly && !isAPI(rule.Host) {
				if !allowsHTTPS(rule.Ports) {
					continue
				}
				rule.Ports = []uint32{443}
			}
			egress.Allow = append(egress.Allow, rule)
		}
		d := sdk.Allow()
		d.Egress = egress
		d.Annotations = map[string]string{
			"egress": fmt.Sprintf("kept %d of %d rules (%s)", len(egress.Allow), len(in.Egress.Allow), r.names),
		}
		return d
	})
}

// isAPI reports whether host names one of the edge's configured APIs.
func isAPI(host string) bool {
	return strings.HasSuffix(strings.ToLower(strings.TrimSuffix(host, ".")), ".api.codemode")
}

// allowsHTTPS reports whether a rule's ports include 443 (none: 80 and 443).
func allowsHTTPS(ports []uint32) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if p == 443 {
			return true
		}
	}
	return false
}

func main() {}
