// Command handcodec is the codec measurement's baseline: the same policy as
// protocodec, written with the SDK and its hand-written wire codec. It is
// built by the policy host's benchmarks only; see policies/RATIONALE.md.
package main

import "github.com/codemode-go/codemode/policies/sdk"

func init() {
	sdk.HandleRequest(func(in *sdk.RequestInput) sdk.RequestDecision {
		if in.Execution.Language != "python" {
			return sdk.Deny("only python")
		}
		return sdk.Allow()
	})
}

func main() {}
