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
	data := p
	if len(d.tail) > 0 {
		data = append(d.tail, p...)
		d.tail = nil
	}
	// Hold back the last rune if it is incomplete but may still become
	// valid.
	for i := len(data) - 1; i >= 0 && i >= len(data)-utf8.UTFMax+1; i-- {
		if !utf8.RuneStart(data[i]) {
			continue
		}
		if !utf8.FullRune(data[i:]) {
			d.tail = append([]byte(nil), data[i:]...)
			data = data[:i]
		}
		break
	}
	return toValid(data)
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
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			s.WriteRune(utf8.RuneError)
		} else {
			s.Write(b[:n])
		}
		b = b[n:]
	}
	return s.String()
}
