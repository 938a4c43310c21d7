package policy

import (
	"strings"
	"testing"
	"unicode/utf8"

	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
)

// FuzzRedact checks that no redaction a policy can ask for makes the host
// panic or return invalid UTF-8, and that refused spans are exactly the
// out-of-order or out-of-range ones.
func FuzzRedact(f *testing.F) {
	f.Add("hello AKIA world", uint32(6), uint32(10), "[x]", uint32(11), uint32(16), "")
	f.Add("é", uint32(0), uint32(1), "", uint32(1), uint32(2), "z")
	f.Add("", uint32(0), uint32(0), "a", uint32(0), uint32(0), "b")
	f.Fuzz(func(t *testing.T, s string, s1, e1 uint32, r1 string, s2, e2 uint32, r2 string) {
		if !utf8.ValidString(s) || !utf8.ValidString(r1) || !utf8.ValidString(r2) {
			return // the result's text and protobuf strings are UTF-8
		}
		spans := []*policyv1.Redaction{
			{Stream: policyv1.Stream_STREAM_STDOUT, Start: s1, End: e1, Replacement: r1},
			{Stream: policyv1.Stream_STREAM_STDOUT, Start: s2, End: e2, Replacement: r2},
		}
		out, err := redact(s, spans)
		valid := s1 <= e1 && e1 <= s2 && s2 <= e2 && e2 <= uint32(len(s))
		if valid != (err == nil) {
			t.Fatalf("redact(%q, [%d,%d) [%d,%d)) err = %v, want valid=%v", s, s1, e1, s2, e2, err, valid)
		}
		if err == nil {
			if !utf8.ValidString(out) {
				t.Fatalf("redact returned invalid UTF-8 %q", out)
			}
			if !strings.Contains(out, r1) || !strings.Contains(out, r2) {
				t.Fatalf("redact(%q) = %q lacks a replacement", s, out)
			}
		}
	})
}

// FuzzParseConfig checks that no configuration file makes the parser panic.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"policies": []}`))
	f.Add([]byte(`{"deadline": "5ms", "labels": {"pool": ["a"]}, "policies": [{"name": "a", "path": "a.wasm", "sha256": "` + strings.Repeat("0", 64) + `", "phase": "request"}]}`))
	f.Add([]byte(`{"policies": [{"name": "a", "config_base64": "!!"}]}`))
	f.Add([]byte(`{"fuel": 1, "fuel_per_input_byte": 18446744073709551615, "policies": [{"name": "a", "path": "a.wasm", "sha256": "` + strings.Repeat("0", 64) + `", "phase": "result", "fuel": 7}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err != nil {
			return
		}
		if c.Deadline <= 0 {
			t.Fatalf("accepted config without a positive deadline: %s", b)
		}
		for _, p := range c.Policies {
			if p.Deadline <= 0 || p.fuel(0) == 0 || p.fuel(1<<30) < p.fuel(0) {
				t.Fatalf("accepted policy %s without a positive deadline and fuel: %s", p.Name, b)
			}
		}
	})
}
