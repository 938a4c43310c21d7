package web

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, h http.Handler, method, target string, header map[string]string) *http.Response {
	t.Helper()
	req := httptest.NewRequestWithContext(t.Context(), method, target, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, res *http.Response) []byte {
	t.Helper()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// refs are the files index.html loads.
var refs = regexp.MustCompile(`(?:src|href)="([^"#]+)"`)

func TestPageAndEveryFileItLoads(t *testing.T) {
	t.Parallel()
	h := Handler()
	res := get(t, h, http.MethodGet, "/", nil)
	page := body(t, res)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET / = %d", res.StatusCode)
	}
	if got := res.Header.Get("Content-Type"); got != "text/html; charset=utf-8" {
		t.Errorf("Content-Type = %q", got)
	}
	if got := res.Header.Get("Cache-Control"); got != "no-cache" {
		t.Errorf("Cache-Control of the page = %q, want no-cache", got)
	}
	if !bytes.Contains(page, []byte(`id="run"`)) || !bytes.Contains(page, []byte(`id="language"`)) {
		t.Fatalf("page lacks the run button or language select:\n%s", page)
	}
	wantTypes := map[string]string{".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
	var seen []string
	for _, m := range refs.FindAllSubmatch(page, -1) {
		ref := string(m[1])
		if ref == "./" {
			continue
		}
		if strings.Contains(ref, ":") || strings.HasPrefix(ref, "//") {
			t.Errorf("page loads %q from elsewhere; everything must come from its own origin", ref)
			continue
		}
		seen = append(seen, ref)
		res := get(t, h, http.MethodGet, "/"+ref, nil)
		b := body(t, res)
		if res.StatusCode != http.StatusOK || len(b) == 0 {
			t.Errorf("GET /%s = %d with %d bytes", ref, res.StatusCode, len(b))
			continue
		}
		ext := ref[strings.LastIndex(ref, "."):]
		if got := res.Header.Get("Content-Type"); got != wantTypes[ext] {
			t.Errorf("/%s Content-Type = %q, want %q", ref, got, wantTypes[ext])
		}
		wantCache := cacheRevalidate
		if ext == ".js" || ext == ".css" {
			wantCache = cacheImmutable
		}
		if got := res.Header.Get("Cache-Control"); got != wantCache {
			t.Errorf("/%s Cache-Control = %q, want %q", ref, got, wantCache)
		}
	}
	if len(seen) != 3 {
		t.Errorf("page loads %v, want a script, a style sheet and an icon", seen)
	}
}

func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	res := get(t, Handler(), http.MethodGet, "/", nil)
	csp := res.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	if strings.Contains(csp, "unsafe") || strings.Contains(csp, "*") {
		t.Errorf("CSP %q allows too much", csp)
	}
	if got := res.Header.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options = %q", got)
	}
}

func TestGzip(t *testing.T) {
	t.Parallel()
	h := Handler()
	plain := get(t, h, http.MethodGet, "/", nil)
	want := body(t, plain)
	if plain.Header.Get("Content-Encoding") != "" {
		t.Fatalf("gzip sent to a client that did not ask for it")
	}
	res := get(t, h, http.MethodGet, "/", map[string]string{"Accept-Encoding": "br, gzip;q=0.8"})
	if res.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("Content-Encoding = %q, want gzip", res.Header.Get("Content-Encoding"))
	}
	if res.Header.Get("ETag") == plain.Header.Get("ETag") {
		t.Errorf("gzip and identity share ETag %s", res.Header.Get("ETag"))
	}
	if !strings.Contains(res.Header.Get("Vary"), "Accept-Encoding") {
		t.Errorf("Vary = %q", res.Header.Get("Vary"))
	}
	zr, err := gzip.NewReader(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("gunzipped page differs from the page")
	}
}

func TestConditionalAndHead(t *testing.T) {
	t.Parallel()
	h := Handler()
	first := get(t, h, http.MethodGet, "/", map[string]string{"Accept-Encoding": "gzip"})
	etag := first.Header.Get("ETag")
	if etag == "" {
		t.Fatal("no ETag")
	}
	for _, inm := range []string{etag, "W/" + etag, `"other", ` + etag, "*"} {
		res := get(t, h, http.MethodGet, "/", map[string]string{"If-None-Match": inm})
		if res.StatusCode != http.StatusNotModified || len(body(t, res)) != 0 {
			t.Errorf("If-None-Match %s: %d, want 304 with no body", inm, res.StatusCode)
		}
	}
	if res := get(t, h, http.MethodGet, "/", map[string]string{"If-None-Match": `"other"`}); res.StatusCode != http.StatusOK {
		t.Errorf("stale If-None-Match: %d, want 200", res.StatusCode)
	}
	res := get(t, h, http.MethodHead, "/", nil)
	if res.StatusCode != http.StatusOK || len(body(t, res)) != 0 || res.Header.Get("Content-Length") == "" {
		t.Errorf("HEAD /: %d, Content-Length %q", res.StatusCode, res.Header.Get("Content-Length"))
	}
}

func TestNotFoundAndMethods(t *testing.T) {
	t.Parallel()
	h := Handler()
	for _, tc := range []struct {
		name, method, path string
		want               int
	}{
		{"unknown file", http.MethodGet, "/nope.js", http.StatusNotFound},
		{"directory listing", http.MethodGet, "/dist/", http.StatusNotFound},
		{"unknown RPC stays not found", http.MethodPost, "/codemode.nope.v1.Nope/Call", http.StatusNotFound},
		{"post to the page", http.MethodPost, "/", http.StatusMethodNotAllowed},
		{"index by name", http.MethodGet, "/index.html", http.StatusOK},
		{"icon", http.MethodGet, "/favicon.svg", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := get(t, h, tc.method, tc.path, nil)
			if res.StatusCode != tc.want {
				t.Fatalf("%s %s = %d, want %d", tc.method, tc.path, res.StatusCode, tc.want)
			}
			if tc.want == http.StatusMethodNotAllowed && res.Header.Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow = %q", res.Header.Get("Allow"))
			}
		})
	}
}

var acceptCases = []struct {
	header string
	want   bool
}{
	{"", false},
	{"gzip", true},
	{"GZIP", true},
	{"deflate, gzip;q=1.0, *;q=0.5", true},
	{"br", false},
	{"gzip;q=0", false},
	{"gzip; q=0.0", false},
	{"gzip;q=0.001", true},
	{"x-gzip", false},
}

func TestAcceptsGzip(t *testing.T) {
	t.Parallel()
	for _, tc := range acceptCases {
		if got := acceptsGzip(tc.header); got != tc.want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", tc.header, got, tc.want)
		}
	}
}

func FuzzHeaders(f *testing.F) {
	for _, tc := range acceptCases {
		f.Add(tc.header)
	}
	f.Add(`W/"abc", "def-gz", *`)
	f.Fuzz(func(t *testing.T, header string) {
		_ = acceptsGzip(header)
		if etagMatch(header, "tag") && !strings.Contains(header, "tag") && !strings.Contains(header, "*") {
			t.Fatalf("etagMatch(%q) matched a tag it does not name", header)
		}
	})
}
