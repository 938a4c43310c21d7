// Command redact is a result-phase policy that removes secrets from a run's
// output before the caller sees it: AWS access key ids (AKIA... and ASIA...,
// 20 characters) and PEM private key blocks ("-----BEGIN ... PRIVATE
// KEY-----" up to the matching END line, or to the end of the output if it
// was cut short). Each is replaced by "[REDACTED aws-access-key-id]" or
// "[REDACTED private-key]".
//
// It scans bytes without regular expressions, so a call costs little more
// than reading the output once.
package main

import (
	"strings"

	"github.com/codemode-go/codemode/policies/sdk"
)

func init() {
	sdk.HandleResult(func(in *sdk.ResultInput) sdk.ResultDecision {
		d := sdk.AllowResult()
		d.Redactions = scan(d.Redactions, sdk.StreamStdout, in.Result.Stdout)
		d.Redactions = scan(d.Redactions, sdk.StreamStderr, in.Result.Stderr)
		return d
	})
}

const (
	beginMark = "-----BEGIN "
	keyMark   = "PRIVATE KEY-----"
	endMark   = "-----END "
)

// scan appends the redactions of s, in order and without overlaps.
func scan(out []sdk.Redaction, stream sdk.Stream, s string) []sdk.Redaction {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case 'A':
			if n := accessKeyAt(s, i); n > 0 {
				out = append(out, sdk.Redaction{Stream: stream, Start: uint32(i), End: uint32(i + n),
					Replacement: "[REDACTED aws-access-key-id]"})
				i += n - 1
			}
		case '-':
			if n := privateKeyAt(s, i); n > 0 {
				out = append(out, sdk.Redaction{Stream: stream, Start: uint32(i), End: uint32(i + n),
					Replacement: "[REDACTED private-key]"})
				i += n - 1
			}
		}
	}
	return out
}

// accessKeyAt returns the length of an AWS access key id at s[i:], or 0.
func accessKeyAt(s string, i int) int {
	const n = 20
	if i+n > len(s) || !(strings.HasPrefix(s[i:], "AKIA") || strings.HasPrefix(s[i:], "ASIA")) {
		return 0
	}
	if i > 0 && isKeyChar(s[i-1]) {
		return 0
	}
	for j := i + 4; j < i+n; j++ {
		if !isKeyChar(s[j]) {
			return 0
		}
	}
	if i+n < len(s) && isKeyChar(s[i+n]) {
		return 0
	}
	return n
}

func isKeyChar(c byte) bool { return c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }

// privateKeyAt returns the length of a PEM private key block at s[i:], or 0.
func privateKeyAt(s string, i int) int {
	if !strings.HasPrefix(s[i:], beginMark) {
		return 0
	}
	eol := strings.IndexByte(s[i:], '\n')
	header := s[i:]
	if eol >= 0 {
		header = s[i : i+eol]
	}
	if !strings.HasSuffix(strings.TrimRight(header, "\r"), keyMark) {
		return 0
	}
	end := strings.Index(s[i:], endMark)
	if end < 0 {
		return len(s) - i // cut short: redact to the end
	}
	j := i + end + len(endMark)
	if k := strings.Index(s[j:], "-----"); k >= 0 {
		return j + k + len("-----") - i
	}
	return len(s) - i
}

func main() {}
