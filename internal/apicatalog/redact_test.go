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
	"testing"
	"testing/iotest"
)

// jsonEscape writes s with the characters whose bit is set in mask as
// \uXXXX (upper-case hex when upper), and '/' as \/ otherwise.
func jsonEscape(s string, mask uint64, upper bool) string {
	var b strings.Builder
	for i := range len(s) {
		c := s[i]
		switch {
		case mask>>(i%64)&1 == 1 && upper:
			fmt.Fprintf(&b, `\u%04X`, c)
		case mask>>(i%64)&1 == 1:
			fmt.Fprintf(&b, `\u%04x`, c)
		case c == '/':
			b.WriteString(`\/`)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// percentEscape writes s with the characters whose bit is set in mask as
// %XX, and spaces as '+'.
func percentEscape(s string, mask uint64, upper bool) string {
	var b strings.Builder
	for i := range len(s) {
		c := s[i]
		switch {
		case mask>>(i%64)&1 == 1 && upper:
			fmt.Fprintf(&b, "%%%02X", c)
		case mask>>(i%64)&1 == 1:
			fmt.Fprintf(&b, "%%%02x", c)
		case c == ' ':
			b.WriteByte('+')
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// mixEscape writes each character of s as itself, a JSON escape, a
// percent escape or an HTML character reference, chosen by two bits of
// mask.
func mixEscape(s string, mask uint64) string {
	var b strings.Builder
	for i := range len(s) {
		switch mask >> (2 * (i % 32)) & 3 {
		case 1:
			fmt.Fprintf(&b, `\u%04x`, s[i])
		case 2:
			fmt.Fprintf(&b, "%%%02X", s[i])
		case 3:
			fmt.Fprintf(&b, "&#%d;", s[i])
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// forms are the encodings of a secret an echoing API may send, each with
// a name.
func forms(secret string) map[string]string {
	b64 := func(enc *base64.Encoding, s string) string { return enc.EncodeToString([]byte(s)) }
	return map[string]string{
		"raw":                     secret,
		"json slash":              jsonEscape(secret, 0, false),
		"json all \\u":            jsonEscape(secret, ^uint64(0), false),
		"json all \\U":            jsonEscape(secret, ^uint64(0), true),
		"json some \\u":           jsonEscape(secret, 0x5a5a5a5a5a5a5a5a, false),
		"percent all":             percentEscape(secret, ^uint64(0), true),
		"percent all lower":       percentEscape(secret, ^uint64(0), false),
		"percent some":            percentEscape(secret, 0x0f0f0f0f0f0f0f0f, false),
		"percent and json":        mixEscape(secret, 0x9c9c9c9c9c9c9c9c),
		"json, percent and html":  mixEscape(secret, 0xe4e4e4e4e4e4e4e4),
		"html decimal":            mixEscape(secret, ^uint64(0)),
		"html hex":                strings.NewReplacer("/", "&#x2F;", "+", "&#x2b;", " ", "&#X20;", "g", "&#x067;").Replace(secret),
		"basic in html":           strings.NewReplacer("+", "&#43;", "/", "&#47;", "=", "&#61;").Replace(b64(base64.StdEncoding, "me:"+secret)),
		"base64":                  b64(base64.StdEncoding, secret),
		"base64 url raw":          b64(base64.RawURLEncoding, secret),
		"basic user:token":        b64(base64.StdEncoding, "user:"+secret),
		"basic u:token":           b64(base64.StdEncoding, "u:"+secret),
		"basic us:token url":      b64(base64.URLEncoding, "us:"+secret+"!"),
		"basic in json":           jsonEscape(b64(base64.StdEncoding, "octo:"+secret), 0, false),
		"basic percent-encoded":   percentEscape(b64(base64.StdEncoding, "me:"+secret), 0xffff0000ffff0000, true),
		"base64 with \\u escapes": jsonEscape(b64(base64.StdEncoding, secret), 0x00ff00ff00ff00ff, false),
	}
}

// secretForForms has the characters that encoders escape: '/', '+', ' '.
const secretForForms = "ghp_A1b2/C3d+E4 f5G6h7~I8j9.K0"

func testRedactor(refuse bool) *Redactor { return NewRedactor([]byte(secretForForms), refuse) }

func TestRedactorForms(t *testing.T) {
	t.Parallel()
	r := testRedactor(false)
	for name, form := range forms(secretForForms) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			body := `{"echo": "` + form + `", "n": 1}`
			out, err := r.Bytes([]byte(body))
			if err != nil || strings.Contains(string(out), form) || !strings.Contains(string(out), Redacted) {
				t.Fatalf("Bytes(%s) = %s, %v: the form is kept", body, out, err)
			}
			if !strings.HasPrefix(string(out), `{"echo": "`) || !strings.HasSuffix(string(out), `", "n": 1}`) {
				t.Errorf("Bytes(%s) = %s: more than the form went", body, out)
			}
			// Read byte by byte, the answer is the same.
			got, err := io.ReadAll(r.Reader(io.NopCloser(iotest.OneByteReader(strings.NewReader(body)))))
			if err != nil || string(got) != string(out) {
				t.Errorf("Reader, one byte at a time: %s, %v; want %s", got, err, out)
			}
			// Refused whole and streamed.
			if _, err := testRedactor(true).Bytes([]byte(body)); !errors.Is(err, ErrEcho) {
				t.Errorf("refusing: %v, want ErrEcho", err)
			}
			got, err = io.ReadAll(testRedactor(true).Reader(io.NopCloser(iotest.OneByteReader(strings.NewReader(body)))))
			if !errors.Is(err, ErrEcho) || strings.Contains(string(got), form) {
				t.Errorf("refusing Reader: %q, %v; want ErrEcho and no form", got, err)
			}
		})
	}
}

func TestRedactorLeavesOtherText(t *testing.T) {
	t.Parallel()
	r := testRedactor(false)
	for _, s := range []string{
		`{"login": "octocat", "url": "https:\/\/api.github.com\/users\/octocat?x=%2F&y=a+b", "note": "\u00e9\\"}`,
		"ghp_A1b2/C3d+E4 f5G6h7~I8j9.K", // all but the last character
		"hp_A1b2/C3d+E4 f5G6h7~I8j9.K0", // all but the first
		base64.StdEncoding.EncodeToString([]byte("ghp_A1b2/C3d+E4 f5G6h7~I8j9.K")),
		"%", "\\", `\u00`, "%4", "+", "", "&", "&amp; &#; &#x; &#xzz; &#123456789012; &lt;b&gt;",
	} {
		if out, _ := r.Bytes([]byte(s)); string(out) != s {
			t.Errorf("Bytes(%q) = %q, want it unchanged", s, out)
		}
	}
}

// TestRedactorHoldsBack checks that what could be the start of a form is
// held back until the bytes after it tell, and let through after.
func TestRedactorHoldsBack(t *testing.T) {
	t.Parallel()
	r := testRedactor(false)
	for _, tc := range []struct{ in, kept string }{
		{`x ghp_A1b2`, `x `},
		{`x ghp_A1b2\`, `x `},
		{`x ghp_A1b2\u00`, `x `},
		{`x ghp_A1b2%2`, `x `},
		{`x ghp_A1b2&#4`, `x `},
		{`x ghp_A1b2&#x`, `x `},
		{`x ghp_A1b2&am`, `x `},
		{`x ghp_A1b2&#4x`, `x ghp_A1b2&#4x`},
		{`x ghp_A1b2\u00zz`, `x ghp_A1b2\u00zz`},
		{`x \`, `x `},
		{`x %`, `x `},
		{`x done`, `x done`},
	} {
		out, safe := r.redact([]byte(tc.in), false)
		if got := string(out[:len(out)-(len(tc.in)-safe)]); got != tc.kept {
			t.Errorf("redact(%q, more to come) lets %q through, want %q", tc.in, got, tc.kept)
		}
	}
}

// TestResponse checks an answer as both paths pass it on: reason phrase,
// headers (names and values, Location included), trailers, content
// codings, ranges.
func TestResponse(t *testing.T) {
	t.Parallel()
	echo := jsonEscape(secretForForms, 0x3, false)
	basic := base64.StdEncoding.EncodeToString([]byte("user:" + secretForForms))
	t.Run("redacted", func(t *testing.T) {
		t.Parallel()
		responseRedacted(t, echo, basic)
	})
	t.Run("deflate", func(t *testing.T) {
		t.Parallel()
		res := answer(200, "200 OK", http.Header{"Content-Encoding": {"deflate"}}, zl("x "+secretForForms))
		if err := testRedactor(false).Response(res); err != nil {
			t.Fatal(err)
		}
		if body, err := io.ReadAll(res.Body); err != nil || string(body) != "x "+Redacted {
			t.Errorf("body %q, %v", body, err)
		}
	})
	for _, tc := range []struct {
		name string
		res  *http.Response
	}{
		{"partial", answer(206, "206 Partial Content", http.Header{"Content-Range": {"bytes 0-3/40"}}, []byte("ghp_"))},
		{"switch", answer(101, "101 Switching Protocols", http.Header{"Upgrade": {"websocket"}}, nil)},
		{"brotli", answer(200, "200 OK", http.Header{"Content-Encoding": {"br"}}, []byte("\x1b"))},
		{"bad gzip", answer(200, "200 OK", http.Header{"Content-Encoding": {"gzip"}}, []byte("not gzip"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if err := testRedactor(false).Response(tc.res); !errors.Is(err, ErrUnchecked) {
				t.Errorf("Response: %v, want ErrUnchecked", err)
			}
		})
	}
	t.Run("refused", func(t *testing.T) {
		t.Parallel()
		responseRefused(t, echo, basic)
	})
}

// gz is s gzipped.
func gz(s string) []byte {
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	io.WriteString(w, s)
	w.Close()
	return b.Bytes()
}

// zl is s in zlib's format (HTTP's deflate).
func zl(s string) []byte {
	var b bytes.Buffer
	w := zlib.NewWriter(&b)
	io.WriteString(w, s)
	w.Close()
	return b.Bytes()
}

// answer is a response as an API sends it, with the secret in a trailer.
func answer(code int, status string, h http.Header, body []byte) *http.Response {
	if h == nil {
		h = http.Header{}
	}
	return &http.Response{StatusCode: code, Status: status, Header: h, Body: io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)), Trailer: http.Header{"X-Trailer": {secretForForms}}}
}

// responseRedacted is TestResponse's "redacted"; echo and basic are the
// secret as TestResponse encodes it.
func responseRedacted(t *testing.T, echo, basic string) {
	res := answer(401, "401 bad token "+secretForForms, http.Header{
		"Location": {"/login?token=" + percentEscape(secretForForms, ^uint64(0), false)},
		"X-Echo":   {"Basic " + basic},
		"X-" + base64.RawURLEncoding.EncodeToString([]byte(secretForForms)): {"1"},
		"Content-Encoding": {"gzip"},
		"Trailer":          {"X-Trailer"},
		"Content-Length":   {"99"},
	}, gz(`{"you sent": "`+echo+`"}`))
	if err := testRedactor(false).Response(res); err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != "401 bad token "+Redacted || res.Header.Get("Location") != "/login?token="+Redacted ||
		!strings.HasPrefix(res.Header.Get("X-Echo"), "Basic ") || !strings.Contains(res.Header.Get("X-Echo"), Redacted) {
		t.Errorf("status %q, headers %v", res.Status, res.Header)
	}
	for k, vs := range res.Header {
		for _, v := range append(vs, k) {
			if testRedactor(false).Found([]byte(v)) {
				t.Errorf("header %s: %q holds the secret", k, v)
			}
		}
	}
	if res.Header.Get("Content-Encoding") != "" || res.Header.Get("Content-Length") != "" || res.Header.Get("Trailer") != "" || res.Trailer != nil || res.ContentLength != -1 {
		t.Errorf("headers %v, trailer %v, length %d", res.Header, res.Trailer, res.ContentLength)
	}
	if string(body) != `{"you sent": "`+Redacted+`"}` {
		t.Errorf("body %s", body)
	}
}

// responseRefused is TestResponse's "refused"; echo and basic are the
// secret as TestResponse encodes it.
func responseRefused(t *testing.T, echo, basic string) {
	for name, res := range map[string]*http.Response{
		"status":    answer(400, "400 "+echo, nil, nil),
		"location":  answer(302, "302 Found", http.Header{"Location": {"/x?t=" + percentEscape(secretForForms, 1, true)}}, nil),
		"body":      answer(200, "200 OK", nil, []byte(basic)),
		"gzip body": answer(200, "200 OK", http.Header{"Content-Encoding": {"gzip"}}, gz(echo)),
	} {
		if err := testRedactor(true).Response(res); !errors.Is(err, ErrEcho) {
			t.Errorf("%s: %v, want ErrEcho", name, err)
		}
	}
	res := answer(200, "200 OK", http.Header{"Content-Encoding": {"gzip"}}, gz(`{"ok": true}`))
	if err := testRedactor(true).Response(res); err != nil {
		t.Fatal(err)
	}
	if body, err := io.ReadAll(res.Body); err != nil || string(body) != `{"ok": true}` || res.ContentLength != int64(len(body)) {
		t.Errorf("a clean answer: %q, %v, length %d", body, err, res.ContentLength)
	}
	// Past what is checked before the status goes, an echo ends the
	// body with an error, and none of it is read.
	long := strings.Repeat("x", maxCheckedBody+100) + echo + "tail"
	res = answer(200, "200 OK", nil, []byte(long))
	if err := testRedactor(true).Response(res); err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	if !errors.Is(err, ErrEcho) || len(body) > maxCheckedBody+100 {
		t.Errorf("a long echo: %d bytes, %v", len(body), err)
	}
}

func TestDeclaredHeadersCodemodeSets(t *testing.T) {
	t.Parallel()
	for _, h := range []string{"Accept-Encoding", "Range", "If-Range", "TE", "Trailer", "Upgrade"} {
		_, err := Parse([]byte(`{"apis": [{"name": "ex", "base_url": "http://127.0.0.1:9", "headers": {"` + h + `": "x"}}]}`))
		if err == nil || !strings.Contains(err.Error(), "is set by codemode") {
			t.Errorf("declared header %s: %v", h, err)
		}
	}
	c, err := Parse([]byte(`{"apis": [{"name": "ex", "base_url": "http://127.0.0.1:9"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := c.Lookup("ex")
	if h, _ := a.Header(t.Context()); h.Get("Accept-Encoding") != "identity" {
		t.Errorf("headers %v, want Accept-Encoding: identity", h)
	}
}

// oldRedact is the redactor before encoded forms were looked for: the raw
// secret only. It is the benchmarks' baseline.
func oldRedact(s, b []byte) []byte {
	if !bytes.Contains(b, s) {
		return b
	}
	return bytes.ReplaceAll(b, s, []byte(Redacted))
}

// benchBody is JSON of about size bytes shaped like a GitHub answer, with
// no secret in it: the common case.
func benchBody(size int) []byte {
	var b bytes.Buffer
	b.WriteString("[")
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"id":%d,"node_id":"MDEwOlJlcG9zaXRvcnk%d","name":"repo-%d","full_name":"octocat/repo-%d","private":false,"html_url":"https://github.com/octocat/repo-%d","description":"A \"quoted\" description with a path \/usr\/local and 50%% more","url":"https://api.github.com/repos/octocat/repo-%d","stargazers_count":%d}`, i, i, i, i, i, i, i)
	}
	b.WriteString("]")
	return b.Bytes()[:size]
}

func BenchmarkRedact(b *testing.B) {
	secret := []byte("ghp_0123456789abcdefghijklmnopqrstuvwxyzAB")
	r := NewRedactor(secret, false)
	for _, size := range []int{1 << 10, 64 << 10} {
		body := benchBody(size)
		b.Run(fmt.Sprintf("old/%dKB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				oldRedact(secret, body)
			}
		})
		b.Run(fmt.Sprintf("bytes/%dKB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				_, _ = r.Bytes(body)
			}
		})
		b.Run(fmt.Sprintf("reader/%dKB", size>>10), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size))
			for b.Loop() {
				_, _ = io.Copy(io.Discard, r.Reader(io.NopCloser(bytes.NewReader(body))))
			}
		})
	}
}
