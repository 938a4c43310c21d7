// Command prelude is a request-phase policy that rewrites Python code: it
// puts its configuration (Python source) before the caller's code, for
// example to lower the recursion limit or install an audit hook.
//
// Runs in other languages pass unchanged. The caller's line numbers shift by
// the prelude's; keep it to one line where that matters.
package main

import (
	"github.com/codemode-go/codemode/policies/sdk"
)

var prelude string

func init() {
	sdk.HandleInit(func(config []byte) error {
		prelude = string(config)
		if prelude != "" && prelude[len(prelude)-1] != '\n' {
			prelude += "\n"
		}
		return nil
	})
	sdk.HandleRequest(func(in *sdk.RequestInput) sdk.RequestDecision {
		d := sdk.Allow()
		if in.Execution.Language == "python" && prelude != "" {
			d.Rewrite.Code = sdk.String(prelude + in.Execution.Code)
			d.Annotations = map[string]string{"prelude": "applied"}
		}
		return d
	})
}

func main() {}
