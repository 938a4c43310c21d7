// Command limits is a request-phase policy that tightens limits per tenant:
// a maximum timeout, and optionally a maximum output size.
//
// Its configuration has one line per tenant, "tenant: timeout [output_bytes]",
// with the timeout in Go's duration syntax; "*" is every other tenant:
//
//	acme: 60s
//	*: 5s 65536
//
// A request asking for more (or for the default, which is more) gets the
// tenant's maximum; a request asking for less keeps its own.
package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/codemode-go/codemode/policies/sdk"
)

type max struct {
	timeout time.Duration
	output  uint64
}

var maxima map[string]max

func init() {
	sdk.HandleInit(func(config []byte) error {
		maxima = make(map[string]max)
		for i, line := range strings.Split(string(config), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			tenant, rest, ok := strings.Cut(line, ":")
			fields := strings.Fields(rest)
			if !ok || len(fields) == 0 || len(fields) > 2 {
				return fmt.Errorf("line %d: want \"tenant: timeout [output_bytes]\"", i+1)
			}
			var m max
			var err error
			if m.timeout, err = time.ParseDuration(fields[0]); err != nil || m.timeout <= 0 {
				return fmt.Errorf("line %d: bad timeout %q", i+1, fields[0])
			}
			if len(fields) == 2 {
				if m.output, err = strconv.ParseUint(fields[1], 10, 64); err != nil {
					return fmt.Errorf("line %d: bad output_bytes %q", i+1, fields[1])
				}
			}
			maxima[strings.TrimSpace(tenant)] = m
		}
		return nil
	})
	sdk.HandleRequest(func(in *sdk.RequestInput) sdk.RequestDecision {
		m, ok := maxima[in.Tenant]
		if !ok {
			if m, ok = maxima["*"]; !ok {
				return sdk.Allow()
			}
		}
		d := sdk.Allow()
		asked := in.Execution.Timeout
		if asked == 0 {
			asked = sdk.DefaultTimeout
		}
		if asked > m.timeout {
			d.Limits.Timeout = m.timeout
		}
		if m.output != 0 && (in.Execution.OutputBytes == 0 || in.Execution.OutputBytes > m.output) {
			d.Limits.OutputBytes = m.output
		}
		return d
	})
}

func main() {}
