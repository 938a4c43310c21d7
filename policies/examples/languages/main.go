// Command languages is a request-phase policy: a language allow-list per tenant.
//
// Its configuration has one rule per line, "tenant: language, language, ...";
// the tenant "*" is the rule for every tenant without its own line. A tenant
// with no rule and no "*" line may use no language. Lines starting with "#"
// are comments. For example:
//
//	acme: python, bash
//	*: python
package main

import (
	"fmt"
	"strings"

	"github.com/codemode-go/codemode/policies/sdk"
)

var allowed map[string][]string

func init() {
	sdk.HandleInit(func(config []byte) error {
		allowed = make(map[string][]string)
		for i, line := range strings.Split(string(config), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			tenant, langs, ok := strings.Cut(line, ":")
			if !ok {
				return fmt.Errorf("line %d: want \"tenant: language, ...\"", i+1)
			}
			var list []string
			for _, l := range strings.Split(langs, ",") {
				if l = strings.TrimSpace(l); l != "" {
					list = append(list, l)
				}
			}
			allowed[strings.TrimSpace(tenant)] = list
		}
		return nil
	})
	sdk.HandleRequest(func(in *sdk.RequestInput) sdk.RequestDecision {
		if in.APICall != nil {
			// A call of a declared API tool runs no code: not ours to vet.
			return sdk.Allow()
		}
		list, ok := allowed[in.Tenant]
		if !ok {
			list = allowed["*"]
		}
		for _, l := range list {
			if l == in.Execution.Language {
				return sdk.Allow()
			}
		}
		if len(list) == 0 {
			return sdk.Deny("tenant " + in.Tenant + " may not run code")
		}
		return sdk.Deny("language " + in.Execution.Language + " is not allowed for tenant " + in.Tenant +
			" (allowed: " + strings.Join(list, ", ") + ")")
	})
}

func main() {}
