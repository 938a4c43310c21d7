// Command gohostile is a request-phase policy for tests that misbehaves on
// request: code "panic" panics, "loop" spins forever, "alloc" allocates until
// memory runs out, "sleep" sleeps for an hour, "subject" is denied with the
// caller's subject as the reason; anything else is allowed.
package main

import (
	"time"

	"github.com/codemode-go/codemode/policies/sdk"
)

var sink [][]byte

func init() {
	sdk.HandleRequest(func(in *sdk.RequestInput) sdk.RequestDecision {
		switch in.Execution.Code {
		case "panic":
			panic("gohostile: asked to panic")
		case "loop":
			for {
			}
		case "sleep":
			time.Sleep(time.Hour)
		case "subject":
			return sdk.Deny("subject=" + in.Subject)
		case "alloc":
			for {
				sink = append(sink, make([]byte, 1<<20))
			}
		}
		return sdk.Allow()
	})
}

func main() {}
