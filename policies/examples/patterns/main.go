// Command patterns is a request-phase policy that denies code containing
// dangerous patterns, naming the pattern in the reason.
//
// It knows a built-in list (fork bombs, wiping the root file system, raw
// device writes, reverse shells through /dev/tcp); its configuration adds
// lines of the form "pattern => reason". The match is a plain substring
// search of the code, the standard input and the files; it is a guard rail
// against accidents and careless agents, not a sandbox (the sandbox is).
package main

import (
	"fmt"
	"strings"

	"github.com/codemode-go/codemode/policies/sdk"
)

type rule struct{ pattern, reason string }

var builtin = []rule{
	{":(){ :|:& };:", "fork bomb"},
	{"rm -rf /", "deleting the root file system"},
	{"rm -rf --no-preserve-root", "deleting the root file system"},
	{"mkfs.", "formatting a file system"},
	{"of=/dev/sd", "writing to a raw disk"},
	{"/dev/tcp/", "opening a network connection from the shell"},
	{"os.fork()", "forking processes from Python"},
}

var rules []rule

func init() {
	sdk.HandleInit(func(config []byte) error {
		rules = append([]rule(nil), builtin...)
		for i, line := range strings.Split(string(config), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			p, r, ok := strings.Cut(line, "=>")
			p, r = strings.TrimSpace(p), strings.TrimSpace(r)
			if !ok || p == "" || r == "" {
				return fmt.Errorf("line %d: want \"pattern => reason\"", i+1)
			}
			rules = append(rules, rule{p, r})
		}
		return nil
	})
	sdk.HandleRequest(func(in *sdk.RequestInput) sdk.RequestDecision {
		e := &in.Execution
		for _, r := range rules {
			where := ""
			switch {
			case strings.Contains(e.Code, r.pattern):
				where = "code"
			case strings.Contains(string(e.Stdin), r.pattern):
				where = "stdin"
			default:
				for _, f := range e.Files {
					if strings.Contains(string(f.Content), r.pattern) {
						where = "file " + f.Path
						break
					}
				}
			}
			if where != "" {
				return sdk.Deny("dangerous pattern in " + where + ": " + r.reason + " (" + quote(r.pattern) + ")")
			}
		}
		return sdk.Allow()
	})
}

func quote(s string) string { return "\"" + s + "\"" }

func main() {}
