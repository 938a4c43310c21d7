package oidctoken

import (
	"fmt"
	"strings"
)

// Rights is a set of rights a caller holds.
type Rights uint8

// The rights. Every right but Read implies Read.
const (
	// Read: list languages, the caller's own status.
	Read Rights = 1 << iota
	// Execute: run code (Execute, ExecuteStream, /run, execute_code).
	Execute
	// Sessions: open, close and use sessions and their files.
	Sessions
	// APIs: call the declared API tools on /mcp-no-code-execute.
	APIs
)

// AllRights is what an API key grants.
const AllRights = Read | Execute | Sessions | APIs

var rightNames = []struct {
	r    Rights
	name string
}{{Read, "read"}, {Execute, "execute"}, {Sessions, "sessions"}, {APIs, "apis"}}

// Has reports whether rs holds every right in want.
func (rs Rights) Has(want Rights) bool { return rs&want == want }

// String names the rights, comma-separated.
func (rs Rights) String() string {
	var names []string
	for _, n := range rightNames {
		if rs&n.r != 0 {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// Scope returns the default scope that grants r (a single right), as the
// edge names it in insufficient_scope answers.
func (rs Rights) Scope() string {
	for _, n := range rightNames {
		if rs == n.r {
			return "codemode:" + n.name
		}
	}
	return ""
}

func parseRights(names []string) (Rights, error) {
	var rs Rights
	for _, s := range names {
		found := false
		for _, n := range rightNames {
			if s == n.name {
				rs |= n.r
				found = true
			}
		}
		if !found {
			return 0, fmt.Errorf("unknown right %q: want read, execute, sessions or apis", s)
		}
	}
	if rs != 0 {
		rs |= Read
	}
	return rs, nil
}
