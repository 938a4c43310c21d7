package egressrule

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Narrow returns what a run may reach when a policy decided egress decided
// and the run could reach base: exactly the destinations both allow, so a
// decision can narrow base but never widen it.
//
// For each rule D of decided and each rule B of base whose hosts overlap
// (names: one pattern is within the other; addresses: one address or prefix
// is within the other), the result holds the narrower host of the two with
// the ports both allow; a pair with no port in common gives nothing. Two
// hosts overlap only when one is within the other, so this is the whole
// intersection. The result is simplified without changing what it allows:
// rules of the same host are merged, and a rule another one covers is left
// out. Hosts are written in canonical form (see [Rule.Host]). Past
// [MaxRules] rules, the last ones are dropped.
//
// Limits: each is the lower of the two where both are set, and the one set
// where only one is (zero means the agent's default, which any value
// lowers).
//
// A nil decided leaves base as it is: Narrow returns base itself. A nil base
// allows nothing, and so does the result then. Malformed rules (see
// [Validate]) allow nothing: a malformed rule of base is ignored, one of
// decided is dropped. Neither argument is modified, and the result shares
// nothing with them (unless it is base).
//
// dropped describes, as [Rule.String] or with the reason it is invalid, each
// rule of decided that the result does not hold whole (it was left out, or
// cut down to narrower hosts or fewer ports), and the rules past MaxRules:
// what a policy's author wants to see when a decision did not get all it
// asked for.
func Narrow(base, decided *executionv1.Egress) (_ *executionv1.Egress, dropped []string) {
	if decided == nil {
		return base, nil
	}
	var bases []Rule
	for _, b := range base.GetAllow() {
		if r, err := Parse(b); err == nil {
			bases = append(bases, r)
		}
	}
	var out []Rule
	for _, d := range decided.GetAllow() {
		dr, err := Parse(d)
		if err != nil {
			dropped = append(dropped, fmt.Sprintf("invalid rule: %v", err))
			continue
		}
		var whole []uint32 // ports of dr's host that base allows all of
		for _, br := range bases {
			var r Rule
			switch {
			case dr.within(br):
				r = dr
				whole = union(whole, br.ports)
			case br.within(dr):
				r = br
			default:
				continue
			}
			if r.ports = intersect(dr.ports, br.ports); len(r.ports) > 0 {
				out = append(out, r)
			}
		}
		if len(intersect(dr.ports, whole)) != len(dr.ports) {
			dropped = append(dropped, dr.String())
		}
	}
	out = simplify(out)
	if len(out) > MaxRules {
		for _, r := range out[MaxRules:] {
			dropped = append(dropped, fmt.Sprintf("%s (past %d rules)", r, MaxRules))
		}
		out = out[:MaxRules]
	}
	res := &executionv1.Egress{Limits: narrowLimits(base.GetLimits(), decided.GetLimits())}
	for _, r := range out {
		res.Allow = append(res.Allow, r.Proto())
	}
	return res, dropped
}

// simplify merges the rules of the same host and leaves out the rules that
// another one covers (host within, ports among), keeping the order of
// first appearance.
func simplify(rules []Rule) []Rule {
	var merged []Rule
	at := make(map[string]int, len(rules))
	for _, r := range rules {
		if i, ok := at[r.Host()]; ok {
			merged[i].ports = union(merged[i].ports, r.ports)
			continue
		}
		at[r.Host()] = len(merged)
		merged = append(merged, r)
	}
	// Hosts are distinct now, so no two rules cover each other and removing
	// covered ones in any order leaves the same set.
	return slices.DeleteFunc(slices.Clone(merged), func(r Rule) bool {
		for _, o := range merged {
			if o.Host() != r.Host() && r.within(o) && len(intersect(r.ports, o.ports)) == len(r.ports) {
				return true
			}
		}
		return false
	})
}

// intersect returns the ports in both sorted sets, as a new sorted set.
func intersect(a, b []uint32) []uint32 {
	var out []uint32
	for _, p := range a {
		if _, ok := slices.BinarySearch(b, p); ok {
			out = append(out, p)
		}
	}
	return out
}

// union returns the ports in either sorted set, as a new sorted set.
func union(a, b []uint32) []uint32 {
	return slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(a), b...))))
}

// narrowLimits returns the lower of each limit set in b or d, or nil when
// neither sets any.
func narrowLimits(b, d *executionv1.EgressLimits) *executionv1.EgressLimits {
	l := &executionv1.EgressLimits{
		Connections: lowerSet(b.GetConnections(), d.GetConnections()),
		Bytes:       lowerSet(b.GetBytes(), d.GetBytes()),
	}
	if t := lowerSet(connectionTime(b), connectionTime(d)); t > 0 {
		l.ConnectionTime = durationpb.New(t)
	}
	if l.Connections == 0 && l.Bytes == 0 && l.ConnectionTime == nil {
		return nil
	}
	return l
}

// connectionTime returns l's connection time; 0 (the agent's default) when
// unset, malformed or negative.
func connectionTime(l *executionv1.EgressLimits) time.Duration {
	t := l.GetConnectionTime()
	if t == nil || t.CheckValid() != nil || t.AsDuration() < 0 {
		return 0
	}
	return t.AsDuration()
}

// lowerSet returns the lower of a and b, where zero means unset.
func lowerSet[T cmp.Ordered](a, b T) T {
	var zero T
	switch {
	case a == zero:
		return b
	case b == zero:
		return a
	}
	return min(a, b)
}
