package apicatalog

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Redacted is what a Redactor writes in place of a secret.
const Redacted = "[REDACTED]"

// ErrEcho is wrapped by the errors of an answer that echoes the credential
// of an API that refuses echoes (Credential.RefuseEcho).
var ErrEcho = errors.New("the answer echoes the API's credential")

// ErrUnchecked is wrapped by the errors of an answer that cannot be
// checked for the credential, and so is not passed on: a partial answer
// (206), a protocol switch (101), or a body in a content coding other than
// gzip and deflate.
var ErrUnchecked = errors.New("the answer cannot be checked for the API's credential")

// maxCheckedBody is how much of a body a Redactor that refuses echoes
// reads before it lets any of it through, so that an echo in it is an
// error before the status is sent. A longer body is checked as it streams,
// and an echo past this point ends it with an error.
const maxCheckedBody = 4 << 20

// minBase64Form is the shortest base64 form of a secret that is looked
// for: shorter ones would match ordinary text.
const minBase64Form = 8

// A Redactor finds one secret in what an API answers, in the forms an API
// that echoes its input may write it in, and replaces each with [Redacted]
// (or, for an API declared with refuse_echo, reports [ErrEcho]).
//
// The secret is found:
//
//   - as it is;
//   - base64-encoded, with the standard or the URL alphabet, padded or
//     not, at any of the three alignments within a longer base64 text
//     (Basic credentials "user:token" encoded whole);
//   - with any of its characters, in either of these forms, escaped:
//     as JSON escapes (\/, \", \\, \t, \uXXXX in either case), as
//     percent-encoding (%XX in either case, '+' for a space), as HTML
//     character references (&#47; &#x2f; &amp; ..., with their ';'), or a
//     mix of these within one occurrence.
//
// Escapes are decoded as the text is read, character by character, and
// the decoded characters compared with the secret's: no list of variants
// is kept, so an encoder that escapes any subset of characters is caught.
//
// Not found: a secret hashed, encrypted, reversed, split or otherwise
// transformed; in an encoding not listed (hex, base64 broken by line
// breaks, an escape of an escape, a character reference without its ';');
// non-ASCII bytes of a secret written as escapes. Operators should declare scoped,
// least-privilege tokens, and refuse_echo for an API whose answers should
// never hold them.
//
// A nil *Redactor finds nothing. A Redactor is safe for concurrent use;
// the readers it makes are not.
type Redactor struct {
	patterns []pattern
	first    [256]uint8 // bit i: the byte can start a form of patterns[i]
	refuse   bool
}

// pattern is one sequence of characters to find: the secret, or the part
// of one of its base64 encodings that the secret alone determines.
type pattern struct {
	b []byte
	// base64: '-' and '_' stand for '+' and '/' (the URL alphabet).
	base64 bool
}

// NewRedactor returns a Redactor of secret; with refuse, its methods
// report ErrEcho instead of redacting. An empty secret makes a nil
// Redactor.
func NewRedactor(secret []byte, refuse bool) *Redactor {
	if len(secret) == 0 {
		return nil
	}
	r := &Redactor{refuse: refuse, patterns: []pattern{{b: bytes.Clone(secret)}}}
	for k := range 3 {
		// Encode the secret after k other bytes; keep the characters that
		// depend on the secret's bits only: those of characters
		// ceil(8k/6) up to floor(8(k+len)/6).
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, k), secret...))
		start, end := (8*k+5)/6, 8*(k+len(secret))/6
		if end-start >= minBase64Form {
			r.patterns = append(r.patterns, pattern{b: []byte(enc[start:end]), base64: true})
		}
	}
	for i, p := range r.patterns {
		bit := uint8(1) << i
		c := p.b[0]
		r.first[c] |= bit
		r.first[urlAlphabet(c)] |= bit
		if c == ' ' {
			r.first['+'] |= bit
		}
		r.first['\\'] |= bit
		r.first['%'] |= bit
		r.first['&'] |= bit
	}
	return r
}

func urlAlphabet(c byte) byte {
	switch c {
	case '+':
		return '-'
	case '/':
		return '_'
	}
	return c
}

// Redactor returns the Redactor of the secret that h (a header returned by
// [API.Header]) carries, refusing echoes if the credential says so; nil
// when h carries no secret.
func (a *API) Redactor(h http.Header) *Redactor {
	if a.cred == nil {
		return nil
	}
	s := strings.TrimPrefix(h.Get(a.cred.Header), a.cred.Prefix)
	return NewRedactor([]byte(s), a.cred.RefuseEcho)
}

// Redact returns b with every form of the secret that h (a header returned
// by Header) carries replaced by [Redacted] (see [Redactor]), for an API
// that echoes what it was sent; it redacts even where the credential
// refuses echoes. With cut, b is the start of a longer body, and an end of
// b that could be the start of a form of the secret is dropped as well. b
// is returned as is when there is nothing to change.
func (a *API) Redact(h http.Header, b []byte, cut bool) []byte {
	r := a.Redactor(h)
	if r == nil {
		return b
	}
	out, safe := r.redact(b, !cut)
	return out[:len(out)-(len(b)-safe)]
}

// Found reports whether b holds a form of the secret.
func (r *Redactor) Found(b []byte) bool {
	if r == nil {
		return false
	}
	spans, _ := r.scan(b, true, true)
	return len(spans) > 0
}

// Bytes returns b with every form of the secret redacted; with refuse, it
// returns ErrEcho when there is one.
func (r *Redactor) Bytes(b []byte) ([]byte, error) {
	if r == nil {
		return b, nil
	}
	if r.refuse {
		if r.Found(b) {
			return nil, ErrEcho
		}
		return b, nil
	}
	out, _ := r.redact(b, true)
	return out, nil
}

// String is Bytes for a string.
func (r *Redactor) String(s string) (string, error) {
	if r == nil {
		return s, nil
	}
	out, err := r.Bytes([]byte(s))
	return string(out), err
}

// Header redacts the names and values of h in place: a header whose name
// holds the secret is dropped. With refuse, it returns ErrEcho, leaving h
// as it may be, when any holds it.
func (r *Redactor) Header(h http.Header) error {
	if r == nil {
		return nil
	}
	for k, vs := range h {
		if r.Found([]byte(k)) {
			if r.refuse {
				return ErrEcho
			}
			delete(h, k)
			continue
		}
		for i, v := range vs {
			red, err := r.String(v)
			if err != nil {
				return err
			}
			vs[i] = red
		}
	}
	return nil
}

// Response makes res, an API's answer to a request that carried the secret,
// safe to pass on: the reason phrase and every header redacted; trailers
// dropped; a gzip or deflate body decoded; the body redacted as it is read
// (its length is then unknown: Content-Length goes). An answer that cannot
// be checked (see [ErrUnchecked]) is an error. With refuse, an echo found
// in the status line, a header or the first part of the body is ErrEcho,
// and one found later in the body is a read error wrapping ErrEcho.
//
// The errors hold neither the secret nor the API's address. A nil
// Redactor leaves res as it is.
func (r *Redactor) Response(res *http.Response) error {
	if r == nil {
		return nil
	}
	switch res.StatusCode {
	case http.StatusSwitchingProtocols:
		return fmt.Errorf("%w: a protocol switch", ErrUnchecked)
	case http.StatusPartialContent:
		return fmt.Errorf("%w: a partial answer (206)", ErrUnchecked)
	}
	res.Trailer = nil
	res.Header.Del("Trailer")
	var err error
	if res.Status, err = r.String(res.Status); err != nil {
		return err
	}
	if err := r.Header(res.Header); err != nil {
		return err
	}
	if err := decode(res); err != nil {
		return err
	}
	if res.Body == nil || res.Body == http.NoBody {
		return nil
	}
	res.ContentLength = -1
	res.Header.Del("Content-Length")
	if r.refuse {
		head, err := io.ReadAll(io.LimitReader(res.Body, maxCheckedBody+1))
		if err != nil {
			res.Body.Close()
			return fmt.Errorf("read the answer: %w", err)
		}
		if len(head) <= maxCheckedBody {
			res.Body.Close()
			if r.Found(head) {
				return ErrEcho
			}
			res.Trailer = nil
			res.Body, res.ContentLength = io.NopCloser(bytes.NewReader(head)), int64(len(head))
			res.Header.Set("Content-Length", fmt.Sprint(len(head)))
			return nil
		}
		res.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(head), res.Body), res.Body}
	}
	res.Body = &dropTrailer{ReadCloser: r.Reader(res.Body), res: res}
	return nil
}

// dropTrailer drops the trailers of res when its body is closed: the
// transport sets res.Trailer as it reads the end of the body, after any
// earlier nil.
type dropTrailer struct {
	io.ReadCloser
	res *http.Response
}

func (d *dropTrailer) Read(p []byte) (int, error) {
	n, err := d.ReadCloser.Read(p)
	if err != nil {
		d.res.Trailer = nil
	}
	return n, err
}

func (d *dropTrailer) Close() error {
	err := d.ReadCloser.Close()
	d.res.Trailer = nil
	return err
}

// decode replaces a gzip or deflate body of res by its decoded form; other
// content codings are an error.
func decode(res *http.Response) error {
	codings := res.Header.Values("Content-Encoding")
	var list []string
	for _, v := range codings {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				list = append(list, c)
			}
		}
	}
	if len(list) == 0 {
		res.Header.Del("Content-Encoding")
		return nil
	}
	if len(list) > 2 {
		return fmt.Errorf("%w: %d content codings", ErrUnchecked, len(list))
	}
	body := res.Body
	if body == nil {
		body = http.NoBody
	}
	closer := body
	var rd io.Reader = body
	for i := len(list) - 1; i >= 0; i-- {
		switch list[i] {
		case "gzip", "x-gzip":
			zr, err := gzip.NewReader(rd)
			if err != nil {
				closer.Close()
				return fmt.Errorf("%w: the gzip body does not decode: %w", ErrUnchecked, err)
			}
			rd = zr
		case "deflate":
			// Deflate in HTTP is zlib-wrapped; raw deflate is not
			// accepted.
			zr, err := zlib.NewReader(rd)
			if err != nil {
				closer.Close()
				return fmt.Errorf("%w: the deflate body does not decode: %w", ErrUnchecked, err)
			}
			rd = zr
		default:
			closer.Close()
			return fmt.Errorf("%w: content coding %q", ErrUnchecked, list[i])
		}
	}
	res.Body = struct {
		io.Reader
		io.Closer
	}{rd, closer}
	res.Header.Del("Content-Encoding")
	res.Header.Del("Content-Length")
	res.ContentLength = -1
	res.Uncompressed = true
	return nil
}

// Reader returns rc with every form of the secret redacted as it is read.
// What could be the start of a form is held back until the bytes after it
// tell; at most twelve times the length of the longest form. With refuse, a
// form found is a read error wrapping ErrEcho, and nothing of it is
// returned.
func (r *Redactor) Reader(rc io.ReadCloser) io.ReadCloser {
	if r == nil {
		return rc
	}
	return &redactReader{r: r, src: rc}
}

type redactReader struct {
	r    *Redactor
	src  io.ReadCloser
	buf  []byte // buf[keep:n] is read and not yet scanned to the end
	keep int
	n    int
	out  []byte // redacted, not yet returned
	eof  bool
	err  error
}

func (rr *redactReader) Read(p []byte) (int, error) {
	for len(rr.out) == 0 {
		if rr.err != nil {
			return 0, rr.err
		}
		// What was returned goes; what was held back moves to the front.
		rr.n = copy(rr.buf, rr.buf[rr.keep:rr.n])
		rr.keep = 0
		if rr.eof && rr.n == 0 {
			return 0, io.EOF
		}
		if !rr.eof {
			if len(rr.buf)-rr.n < 4<<10 {
				rr.buf = append(rr.buf[:rr.n], make([]byte, max(16<<10, len(rr.buf)))...)
				rr.buf = rr.buf[:cap(rr.buf)]
			}
			k, err := rr.src.Read(rr.buf[rr.n:])
			rr.n += k
			if err == io.EOF {
				rr.eof = true
			} else if err != nil {
				rr.err = err
			}
			if k == 0 && !rr.eof {
				continue
			}
		}
		pending := rr.buf[:rr.n]
		if rr.r.refuse {
			spans, safe := rr.r.scan(pending, rr.eof, true)
			if len(spans) > 0 {
				rr.err = fmt.Errorf("read the answer: %w", ErrEcho)
				return 0, rr.err
			}
			rr.out, rr.keep = pending[:safe:safe], safe
			continue
		}
		out, safe := rr.r.redact(pending, rr.eof)
		rr.out, rr.keep = out[:len(out)-(len(pending)-safe)], safe
	}
	n := copy(p, rr.out)
	rr.out = rr.out[n:]
	return n, nil
}

func (rr *redactReader) Close() error { return rr.src.Close() }

// redact returns b with the forms found in b[:safe] replaced, followed by
// b[safe:] as it is; safe is where a form that more bytes could complete
// starts (len(b) when final).
func (r *Redactor) redact(b []byte, final bool) (out []byte, safe int) {
	spans, safe := r.scan(b, final, false)
	if len(spans) == 0 {
		return b, safe
	}
	out = make([]byte, 0, len(b))
	at := 0
	for _, s := range spans {
		out = append(out, b[at:s[0]]...)
		out = append(out, Redacted...)
		at = s[1]
	}
	return append(out, b[at:]...), safe
}

// scan returns the spans of b that are forms of the secret, in order and
// apart, and where a form that more bytes could complete starts (len(b)
// when none does, or when final). With one, it stops at the first span.
func (r *Redactor) scan(b []byte, final, one bool) (spans [][2]int, safe int) {
	for i := 0; i < len(b); i++ {
		bits := r.first[b[i]]
		if bits == 0 {
			continue
		}
		end, partial := 0, false
		for pi := range r.patterns {
			if bits&(1<<pi) == 0 {
				continue
			}
			e, more := r.patterns[pi].match(b, i, final)
			if e > end {
				end = e
			}
			partial = partial || more
		}
		switch {
		case partial && !final:
			// More bytes may make a form here, or a longer one.
			return spans, i
		case end > 0:
			spans = append(spans, [2]int{i, end})
			if one {
				return spans, len(b)
			}
			i = end - 1
		}
	}
	return spans, len(b)
}

// match reports where a form of p that starts at b[i] ends (0 for none),
// and, when there is none, whether more bytes after b could make one.
//
// It follows every way of reading b as escaped characters at once (a '%'
// may be itself or start %XX, a '\' itself or start an escape), keeping
// the offsets reached after each character of p.
func (p *pattern) match(b []byte, i int, final bool) (end int, more bool) {
	// An escape that does not stand for p's first character starts
	// nothing (most escapes in JSON are \" and \/).
	if escapes[b[i]] {
		var buf [4]int
		if next, more := p.unit(b, i, p.b[0], final, buf[:0]); len(next) == 0 {
			return 0, more
		}
	}
	// Most candidates are plain text that differs from p early on: read
	// as it is while no byte could be an escape.
	k := 0
	for k < len(p.b) && i+k < len(b) && !escapes[b[i+k]] {
		if !p.same(b[i+k], p.b[k]) {
			return 0, false
		}
		k++
	}
	if k == len(p.b) {
		return i + k, false
	}
	return p.matchEscaped(b, i, final)
}

// escapes are the bytes that may stand for another character: those that
// start an escape, and '+' for a space.
var escapes = [256]bool{'\\': true, '%': true, '&': true, '+': true}

// matchEscaped is match for text with escapes.
func (p *pattern) matchEscaped(b []byte, i int, final bool) (end int, more bool) {
	var buf1, buf2 [8]int
	at, next := append(buf1[:0], i), buf2[:0]
	for _, want := range p.b {
		next = next[:0]
		for _, o := range at {
			var m bool
			next, m = p.unit(b, o, want, final, next)
			more = more || m
		}
		if len(next) == 0 {
			return 0, more && !final
		}
		at, next = next, at
	}
	if more && !final {
		return 0, true // a way of reading that b cut short may go further
	}
	end = at[0]
	for _, o := range at[1:] {
		end = max(end, o)
	}
	return end, false
}

// unit appends to next the offsets after each way to read, at b[o], one
// character equal to want (as p compares), and reports whether the bytes
// at o could be the start of one but b ends too soon to tell.
func (p *pattern) unit(b []byte, o int, want byte, final bool, next []int) ([]int, bool) {
	if o >= len(b) {
		return next, !final
	}
	c := b[o]
	if p.same(c, want) || c == '+' && want == ' ' {
		next = addOffset(next, o+1)
	}
	switch c {
	case '\\':
		if o+1 >= len(b) {
			return next, !final
		}
		if d, ok := jsonShort(b[o+1]); ok {
			if p.same(d, want) {
				next = addOffset(next, o+2)
			}
			return next, false
		}
		if b[o+1] != 'u' {
			return next, false
		}
		if o+6 > len(b) {
			return next, !final && allHex(b[o+2:])
		}
		if v, ok := hex4(b[o+2 : o+6]); ok && v < 0x80 && p.same(byte(v), want) {
			next = addOffset(next, o+6)
		}
	case '%':
		if o+3 > len(b) {
			return next, !final && allHex(b[o+1:])
		}
		if v, ok := hex2(b[o+1], b[o+2]); ok && p.same(v, want) {
			next = addOffset(next, o+3)
		}
	case '&':
		v, n, more := charRef(b[o:], final)
		if n > 0 && v < 0x80 && p.same(byte(v), want) {
			next = addOffset(next, o+n)
		}
		return next, more
	}
	return next, false
}

// charRefNames are the named character references read.
var charRefNames = []struct {
	name string
	c    rune
}{{"&amp;", '&'}, {"&lt;", '<'}, {"&gt;", '>'}, {"&quot;", '"'}, {"&apos;", '\''}}

// charRef reads an HTML character reference at the start of b (b[0] is
// '&'): numeric (&#47; &#x2F;, up to 8 digits) or one of charRefNames, with
// its ';'. It returns the character and the reference's length (0 for
// none), or whether b ends too soon to tell.
func charRef(b []byte, final bool) (v rune, n int, more bool) {
	for _, r := range charRefNames {
		if bytes.HasPrefix(b, []byte(r.name)) {
			return r.c, len(r.name), false
		}
		if len(b) < len(r.name) && bytes.HasPrefix([]byte(r.name), b) {
			more = !final
		}
	}
	if len(b) < 2 {
		return 0, 0, more || !final
	}
	if b[1] != '#' {
		return 0, 0, more
	}
	i, base := 2, rune(10)
	if i < len(b) && (b[i] == 'x' || b[i] == 'X') {
		i, base = 3, 16
	}
	start := i
	for ; i < len(b) && i-start <= 8; i++ {
		c := b[i]
		if c == ';' {
			if i == start {
				return 0, 0, false
			}
			return v, i + 1, false
		}
		d, ok := unhex(c)
		if !ok || rune(d) >= base {
			return 0, 0, false
		}
		v = v*base + rune(d)
	}
	return 0, 0, i == len(b) && i-start <= 8 && !final
}

func addOffset(offs []int, x int) []int {
	for _, o := range offs {
		if o == x {
			return offs
		}
	}
	return append(offs, x)
}

// same reports whether the character c of the text stands for want, a
// character of p.
func (p *pattern) same(c, want byte) bool {
	return c == want || p.base64 && c == urlAlphabet(want)
}

func jsonShort(c byte) (byte, bool) {
	switch c {
	case '"', '\\', '/':
		return c, true
	case 'b':
		return '\b', true
	case 'f':
		return '\f', true
	case 'n':
		return '\n', true
	case 'r':
		return '\r', true
	case 't':
		return '\t', true
	}
	return 0, false
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

func hex2(a, b byte) (byte, bool) {
	x, ok1 := unhex(a)
	y, ok2 := unhex(b)
	return x<<4 | y, ok1 && ok2
}

func hex4(b []byte) (int, bool) {
	hi, ok1 := hex2(b[0], b[1])
	lo, ok2 := hex2(b[2], b[3])
	return int(hi)<<8 | int(lo), ok1 && ok2
}

func allHex(b []byte) bool {
	for _, c := range b {
		if _, ok := unhex(c); !ok {
			return false
		}
	}
	return true
}
