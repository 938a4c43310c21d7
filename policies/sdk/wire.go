package sdk

import (
	"errors"
	"math"
	"time"
	"unsafe"
)

// This file is a minimal protobuf wire-format codec for the messages of ABI
// v1. It decodes exactly the fields it knows, skips unknown ones as the
// protobuf spec requires, and encodes in field-number order like the
// reference implementation (map entries in no particular order).

// ErrMalformed is returned for bytes that are not valid protobuf wire format.
var ErrMalformed = errors.New("malformed protobuf input")

const (
	wireVarint  = 0
	wireFixed64 = 1
	wireBytes   = 2
	wireFixed32 = 5
)

// reader walks one message's fields.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail() { r.err = ErrMalformed; r.b = nil }

func (r *reader) varint() uint64 {
	if len(r.b) > 0 && r.b[0] < 0x80 { // fast path: one byte
		v := uint64(r.b[0])
		r.b = r.b[1:]
		return v
	}
	var v uint64
	for i := 0; i < 10; i++ {
		if i >= len(r.b) {
			r.fail()
			return 0
		}
		c := r.b[i]
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			r.b = r.b[i+1:]
			return v
		}
	}
	r.fail()
	return 0
}

// next returns the next field's number and wire type; ok is false at the end
// or on error.
func (r *reader) next() (num int32, typ int, ok bool) {
	if len(r.b) == 0 || r.err != nil {
		return 0, 0, false
	}
	t := r.varint()
	if r.err != nil || t>>3 == 0 || t>>3 > math.MaxInt32 {
		r.fail()
		return 0, 0, false
	}
	return int32(t >> 3), int(t & 7), true
}

func (r *reader) bytes() []byte {
	n := r.varint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.fail()
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) skip(typ int) {
	switch typ {
	case wireVarint:
		r.varint()
	case wireFixed64:
		if len(r.b) < 8 {
			r.fail()
			return
		}
		r.b = r.b[8:]
	case wireBytes:
		r.bytes()
	case wireFixed32:
		if len(r.b) < 4 {
			r.fail()
			return
		}
		r.b = r.b[4:]
	default:
		r.fail()
	}
}

// expect checks the wire type of a known field; a mismatch is malformed.
func (r *reader) expect(typ, want int) bool {
	if typ != want {
		r.fail()
		return false
	}
	return true
}

// str returns a string that aliases the input, which the caller of
// Unmarshal promises not to modify: one copy of the input per call instead
// of one allocation per field (allocation is slow in a Go guest).
func (r *reader) str(typ int) string {
	if !r.expect(typ, wireBytes) {
		return ""
	}
	b := r.bytes()
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// byteSlice returns a slice that aliases the input, as str does.
func (r *reader) byteSlice(typ int) []byte {
	if !r.expect(typ, wireBytes) {
		return nil
	}
	b := r.bytes()
	if len(b) == 0 {
		return []byte{}
	}
	return b
}

func (r *reader) uint(typ int) uint64 {
	if !r.expect(typ, wireVarint) {
		return 0
	}
	return r.varint()
}

// uint32s appends the values of a repeated uint32 field to vs: one value,
// or a packed run of them (parsers must accept both encodings).
func (r *reader) uint32s(typ int, vs []uint32) []uint32 {
	switch typ {
	case wireVarint:
		return append(vs, uint32(r.varint()))
	case wireBytes:
		b := r.bytes()
		if r.err != nil {
			return vs
		}
		s := reader{b: b}
		for len(s.b) > 0 && s.err == nil {
			vs = append(vs, uint32(s.varint()))
		}
		if s.err != nil {
			r.fail()
		}
		return vs
	}
	r.fail()
	return vs
}

func (r *reader) sub(typ int) reader {
	if !r.expect(typ, wireBytes) {
		return reader{err: r.err}
	}
	return reader{b: r.bytes(), err: r.err}
}

// duration decodes a google.protobuf.Duration.
func (r *reader) duration(typ int) time.Duration {
	s := r.sub(typ)
	var secs, nanos int64
	for {
		num, t, ok := s.next()
		if !ok {
			break
		}
		switch num {
		case 1:
			secs = int64(s.uint(t))
		case 2:
			nanos = int64(int32(s.uint(t)))
		default:
			s.skip(t)
		}
	}
	if s.err != nil {
		r.fail()
		return 0
	}
	const maxSecs = math.MaxInt64 / int64(time.Second)
	if secs > maxSecs {
		return math.MaxInt64
	}
	if secs < -maxSecs {
		return math.MinInt64
	}
	return time.Duration(secs)*time.Second + time.Duration(nanos)
}

// mapEntry decodes one map<string, string> entry into m, allocating it.
func (r *reader) mapEntry(typ int, m *map[string]string) {
	s := r.sub(typ)
	var k, v string
	for {
		num, t, ok := s.next()
		if !ok {
			break
		}
		switch num {
		case 1:
			k = s.str(t)
		case 2:
			v = s.str(t)
		default:
			s.skip(t)
		}
	}
	if s.err != nil {
		r.fail()
		return
	}
	if *m == nil {
		*m = make(map[string]string)
	}
	(*m)[k] = v
}

func appendVarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func appendTag(b []byte, num int32, typ int) []byte {
	return appendVarint(b, uint64(num)<<3|uint64(typ))
}

func appendString(b []byte, num int32, s string) []byte {
	b = appendTag(b, num, wireBytes)
	b = appendVarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b []byte, num int32, v []byte) []byte {
	b = appendTag(b, num, wireBytes)
	b = appendVarint(b, uint64(len(v)))
	return append(b, v...)
}

func appendUint(b []byte, num int32, v uint64) []byte {
	b = appendTag(b, num, wireVarint)
	return appendVarint(b, v)
}

func varintSize(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// appendDuration encodes d as a google.protobuf.Duration field.
func appendDuration(b []byte, num int32, d time.Duration) []byte {
	secs := int64(d / time.Second)
	nanos := int64(int32(d % time.Second))
	b = appendTag(b, num, wireBytes)
	b = appendVarint(b, uint64(durationSize(d)))
	if secs != 0 {
		b = appendUint(b, 1, uint64(secs))
	}
	if nanos != 0 {
		b = appendUint(b, 2, uint64(nanos))
	}
	return b
}

func appendMap(b []byte, num int32, m map[string]string) []byte {
	for k, v := range m {
		size := 0
		if k != "" {
			size += 1 + varintSize(uint64(len(k))) + len(k)
		}
		if v != "" {
			size += 1 + varintSize(uint64(len(v))) + len(v)
		}
		b = appendTag(b, num, wireBytes)
		b = appendVarint(b, uint64(size))
		if k != "" {
			b = appendString(b, 1, k)
		}
		if v != "" {
			b = appendString(b, 2, v)
		}
	}
	return b
}

// appendPacked appends a packed repeated uint32 field.
func appendPacked(b []byte, num int32, vs []uint32) []byte {
	b = appendLen(b, num, packedSize(vs))
	for _, v := range vs {
		b = appendVarint(b, uint64(v))
	}
	return b
}

func packedSize(vs []uint32) int {
	n := 0
	for _, v := range vs {
		n += varintSize(uint64(v))
	}
	return n
}

// appendLen appends a nested message field's tag and length.
func appendLen(b []byte, num int32, n int) []byte {
	b = appendTag(b, num, wireBytes)
	return appendVarint(b, uint64(n))
}

func stringSize(num int32, s string) int {
	return varintSize(uint64(num)<<3) + varintSize(uint64(len(s))) + len(s)
}

func uintSize(num int32, v uint64) int {
	return varintSize(uint64(num)<<3) + varintSize(v)
}

func durationSize(d time.Duration) int {
	secs := int64(d / time.Second)
	nanos := int64(int32(d % time.Second))
	size := 0
	if secs != 0 {
		size += 1 + varintSize(uint64(secs))
	}
	if nanos != 0 {
		size += 1 + varintSize(uint64(nanos))
	}
	return size
}
