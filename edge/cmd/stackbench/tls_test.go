package main

import (
	"strings"
	"testing"
	"time"
)

// The TLS part's section: both stacks' rows, the handshake rows, the
// ratios, and its check among the Targets; no doors' parts when it ran
// alone.
func TestTLSReports(t *testing.T) {
	t.Parallel()
	st := func(p50, p95, p99 time.Duration) stats {
		return stats{n: 60, p50: p50, p95: p95, p99: p99, errs: map[string]int{}}
	}
	ms := time.Millisecond
	res := &results{tls: &tlsResults{
		plain: st(12*ms, 14*ms, 16*ms), tls: st(12600*time.Microsecond, 15*ms, 18*ms),
		tcp: st(50*time.Microsecond, 180*time.Microsecond, 230*time.Microsecond), handshake: st(1050*time.Microsecond, 1800*time.Microsecond, 4*ms),
		tlsVersion: "TLS 1.3", load: "1.00 2.00 3.00",
	}}
	text := renderText(res)
	md := renderMarkdown(res, "go run ./edge/cmd/stackbench -only tls", "")
	for _, want := range []string{
		"fresh TCP connection and TLS 1.3 handshake with the edge",
		"print(1), tls / plain: p50 1.05x, p95 1.07x, p99 1.12x",
		"p50 21.00x (1.00 ms more)",
		"tls p50 / plain p50, print(1) paced (TLS on every link)",
	} {
		if !strings.Contains(text, want) || !strings.Contains(md, want) {
			t.Errorf("reports lack %q:\n%s\n%s", want, text, md)
		}
	}
	if !strings.Contains(md, "## TLS on every link") || !strings.Contains(md, "| tls p50 / plain p50, print(1) paced (TLS on every link) | 1.05x | - | <= 1.10x | met |") {
		t.Errorf("markdown lacks the TLS section or its check:\n%s", md)
	}
	if strings.Contains(md, "## Results") || strings.Contains(md, "services still running") {
		t.Errorf("a TLS-only report has the doors' parts:\n%s", md)
	}
	res.tls.tls.p50 = 14 * ms
	if cs := tlsChecks(res); len(cs) != 1 || cs[0].passed {
		t.Errorf("tls p50 1.17x plain's: checks %v, want one missed", cs)
	}
}
