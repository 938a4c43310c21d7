// Command routes is a request-phase policy that sends runs to agent pools by
// tenant or by language.
//
// Its configuration has one rule per line, "tenant NAME: key=value, ..." or
// "language NAME: key=value, ...". The labels of every matching rule go into
// the route; a tenant's labels win over a language's for the same key.
//
//	tenant acme: pool=acme
//	language javascript: pool=node
package main

import (
	"fmt"
	"strings"

	"github.com/codemode-go/codemode/policies/sdk"
)

var (
	byTenant   map[string]map[string]string
	byLanguage map[string]map[string]string
)

func init() {
	sdk.HandleInit(func(config []byte) error {
		byTenant = make(map[string]map[string]string)
		byLanguage = make(map[string]map[string]string)
		for i, line := range strings.Split(string(config), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			head, labels, ok := strings.Cut(line, ":")
			kind, name, ok2 := strings.Cut(strings.TrimSpace(head), " ")
			if !ok || !ok2 {
				return fmt.Errorf("line %d: want \"tenant|language NAME: key=value, ...\"", i+1)
			}
			var table map[string]map[string]string
			switch kind {
			case "tenant":
				table = byTenant
			case "language":
				table = byLanguage
			default:
				return fmt.Errorf("line %d: unknown kind %q", i+1, kind)
			}
			m := make(map[string]string)
			for _, kv := range strings.Split(labels, ",") {
				k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
				if !ok || k == "" {
					return fmt.Errorf("line %d: bad label %q", i+1, kv)
				}
				m[k] = v
			}
			table[strings.TrimSpace(name)] = m
		}
		return nil
	})
	sdk.HandleRequest(func(in *sdk.RequestInput) sdk.RequestDecision {
		d := sdk.Allow()
		t, l := byTenant[in.Tenant], byLanguage[in.Execution.Language]
		if len(t) == 0 && len(l) == 0 {
			return d
		}
		d.Route = make(map[string]string, len(t)+len(l))
		for k, v := range l {
			d.Route[k] = v
		}
		for k, v := range t {
			d.Route[k] = v
		}
		return d
	})
}

func main() {}
