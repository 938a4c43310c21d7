package agentd

import (
	"strings"
	"unicode/utf8"
)

// utf8Decoder turns a byte stream that arrives in chunks into valid UTF-8
// strings. A multi-byte sequence split across two chunks is held back until
// the rest arrives, so it is never replaced by mistake; each byte that
// cannot be part of a valid sequence becomes U+FFFD. Not safe for concurrent
// use.
type utf8Decoder struct {
	tail []byte // an incomplete sequence at the end of the last chunk
}

// Decode returns the valid text of p, after whatever an earlier call held
// back, holding back an incomplete sequence at its end.
func (d *utf8Decoder) Decode(p []byte) string {
	var head string
	if len(d.tail) > 0 {
		// Finish the held-back sequence with the first bytes of p, without
		// copying all of p.
		var ok bool
		head, p, ok = d.finishTail(p)
		if !ok {
			return head // p ended before the sequence did
		}
	}
	// Hold back the last rune if it is incomplete but may still become
	// valid.
	for i := len(p) - 1; i >= 0 && i >= len(p)-utf8.UTFMax+1; i-- {
		if !utf8.RuneStart(p[i]) {
			continue
		}
		if !utf8.FullRune(p[i:]) {
			d.tail = append(d.tail[:0], p[i:]...)
			p = p[:i]
		}
		break
	}
	if head == "" {
		return toValid(p)
	}
	var b strings.Builder
	b.Grow(len(head) + len(p))
	b.WriteString(head)
	writeValid(&b, p)
	return b.String()
}

// finishTail decodes the held-back bytes followed by as few bytes of p as
// it takes. It returns their text and the rest of p, or ok false if p ended
// before the held-back sequence could be decided (then all of it is held).
func (d *utf8Decoder) finishTail(p []byte) (head string, rest []byte, ok bool) {
	n := min(len(p), utf8.UTFMax)
	buf := append(append(make([]byte, 0, 2*utf8.UTFMax), d.tail...), p[:n]...)
	tail := len(d.tail)
	d.tail = d.tail[:0]
	var s strings.Builder
	pos := 0
	for pos < tail {
		if !utf8.FullRune(buf[pos:]) {
			// Only possible when p was shorter than the sequence needs.
			d.tail = append(d.tail, buf[pos:]...)
			return s.String(), nil, false
		}
		r, size := utf8.DecodeRune(buf[pos:])
		if r == utf8.RuneError && size == 1 {
			s.WriteRune(utf8.RuneError)
		} else {
			s.Write(buf[pos : pos+size])
		}
		pos += size
	}
	return s.String(), p[pos-tail:], true
}

// Flush returns what is held back, each byte of it replaced by U+FFFD: the
// stream ended in the middle of a sequence.
func (d *utf8Decoder) Flush() string {
	s := toValid(d.tail)
	d.tail = nil
	return s
}

// toValid converts b to a string, replacing each byte that is not part of
// a valid UTF-8 sequence by U+FFFD.
func toValid(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var s strings.Builder
	s.Grow(len(b) + 8)
	writeValid(&s, b)
	return s.String()
}

// writeValid writes b to s as toValid converts it.
func writeValid(s *strings.Builder, b []byte) {
	for len(b) > 0 {
		// Copy the valid run up to the next invalid byte in one go.
		i := 0
		for i < len(b) {
			if b[i] < utf8.RuneSelf {
				i++
				continue
			}
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				break
			}
			i += n
		}
		s.Write(b[:i])
		if i == len(b) {
			return
		}
		s.WriteRune(utf8.RuneError)
		b = b[i+1:]
	}
}
