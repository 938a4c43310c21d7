// Package web serves codemode's web playground: one page that runs code on
// the edge over gRPC-Web and streams its output.
//
// The page is built from this directory's sources by `npm run build` into
// dist/, which is committed and embedded in the binary, so the edge serves it
// without Node.js or files on disk. Handler serves it under a strict
// Content-Security-Policy that lets the page load only its own files and call
// only its own origin.
package web

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"strconv"
	"strings"
)

//go:embed dist
var dist embed.FS

// ContentSecurityPolicy is sent with every response: the page runs only its
// own script and style, and talks only to the origin that served it. Images
// may also come from blob: URLs, which the page makes of a run's artifacts.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Cache-Control values. Bundles carry a content hash in their names and
// never change; the page and the icon are revalidated.
const (
	cacheImmutable  = "public, max-age=31536000, immutable"
	cacheRevalidate = "no-cache"
)

// hashed matches the names esbuild gives bundles: name-HASH.ext.
var hashed = regexp.MustCompile(`-[A-Z0-9]{8}\.(js|css)$`)

var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

// asset is one file, ready to serve.
type asset struct {
	body, gzipped []byte // gzipped is nil when compression does not pay
	contentType   string
	cacheControl  string
	etag          string // strong ETag of body; the gzipped form adds "-gz"
}

// Handler returns an http.Handler that serves the playground at "/" and its
// files next to it. It answers GET and HEAD, honours If-None-Match, and sends
// gzip to clients that accept it. Any other path is 404, so mounting it at "/"
// leaves unknown RPC paths answered as not found. It is safe for concurrent use.
func Handler(opts ...Option) http.Handler {
	assets, err := load(dist)
	if err != nil {
		// dist is embedded at build time; a broken one is a build defect.
		panic(fmt.Sprintf("web: load embedded dist: %v", err))
	}
	h := handler{assets: assets}
	for _, o := range opts {
		o(&h)
	}
	return h
}

// An Option configures Handler.
type Option func(*handler)

// SignInPath is where the page reads its sign-in settings.
const SignInPath = "/signin.json"

// WithSignIn lets the page sign users in with an OpenID provider: settings
// returns what the page needs (served as JSON at SignInPath) and the
// provider's token endpoint, which the page's Content-Security-Policy then
// lets it call (the page goes to the authorization endpoint by navigating,
// which connect-src does not govern). A nil v and error: no sign-in (204,
// as without this option). An error is answered 503; the page then offers
// no sign-in.
func WithSignIn(settings func(ctx context.Context) (v any, tokenEndpoint string, err error)) Option {
	return func(h *handler) { h.signIn = settings }
}

// load reads every file of dist/ and prepares its headers and gzip form.
func load(fsys fs.FS) (map[string]*asset, error) {
	sub, err := fs.Sub(fsys, "dist")
	if err != nil {
		return nil, fmt.Errorf("open dist: %w", err)
	}
	assets := make(map[string]*asset)
	err = fs.WalkDir(sub, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := fs.ReadFile(sub, name)
		if err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		ctype, ok := contentTypes[path.Ext(name)]
		if !ok {
			return fmt.Errorf("%s: no content type for %q", name, path.Ext(name))
		}
		sum := sha256.Sum256(body)
		a := &asset{
			body:         body,
			contentType:  ctype,
			cacheControl: cacheRevalidate,
			etag:         base64.RawURLEncoding.EncodeToString(sum[:12]),
		}
		if hashed.MatchString(name) {
			a.cacheControl = cacheImmutable
		}
		if a.gzipped, err = compress(body); err != nil {
			return fmt.Errorf("compress %s: %w", name, err)
		}
		assets["/"+name] = a
		return nil
	})
	if err != nil {
		return nil, err
	}
	index, ok := assets["/index.html"]
	if !ok {
		return nil, fmt.Errorf("no index.html")
	}
	assets["/"] = index
	return assets, nil
}

// compress returns body gzipped, or nil when that saves less than a tenth.
func compress(body []byte) ([]byte, error) {
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(body); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if b.Len() > len(body)*9/10 {
		return nil, nil
	}
	return b.Bytes(), nil
}

type handler struct {
	assets map[string]*asset
	signIn func(ctx context.Context) (any, string, error) // nil: no sign-in
}

// contentSecurityPolicy is the policy of a response to r: the page's, with
// the token endpoint of the sign-in provider added to connect-src.
func (h handler) contentSecurityPolicy(r *http.Request) string {
	if h.signIn == nil {
		return ContentSecurityPolicy
	}
	_, token, err := h.signIn(r.Context())
	u, perr := url.Parse(token)
	if err != nil || perr != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return ContentSecurityPolicy
	}
	return strings.Replace(ContentSecurityPolicy, "connect-src 'self'", "connect-src 'self' "+u.Scheme+"://"+u.Host, 1)
}

func (h handler) serveSignIn(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	var v any
	var err error
	if h.signIn != nil {
		v, _, err = h.signIn(r.Context())
	}
	if v == nil && err == nil {
		// No sign-in: an empty answer, which a browser does not report as
		// an error in the page's console.
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
		return
	}
	_ = json.NewEncoder(w).Encode(v)
}

func (h handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == SignInPath && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		h.serveSignIn(w, r)
		return
	}
	a, ok := h.assets[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	hdr := w.Header()
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	body, etag := a.body, `"`+a.etag+`"`
	if a.gzipped != nil {
		hdr.Add("Vary", "Accept-Encoding")
		if acceptsGzip(r.Header.Get("Accept-Encoding")) {
			body, etag = a.gzipped, `"`+a.etag+`-gz"`
			hdr.Set("Content-Encoding", "gzip")
		}
	}
	hdr.Set("Content-Type", a.contentType)
	hdr.Set("Cache-Control", a.cacheControl)
	hdr.Set("ETag", etag)
	hdr.Set("Content-Security-Policy", h.contentSecurityPolicy(r))
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("Cross-Origin-Opener-Policy", "same-origin")
	if etagMatch(r.Header.Get("If-None-Match"), a.etag) {
		hdr.Del("Content-Encoding")
		w.WriteHeader(http.StatusNotModified)
		return
	}
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(body)
}

// acceptsGzip reports whether an Accept-Encoding header admits gzip.
func acceptsGzip(header string) bool {
	for part := range strings.SplitSeq(header, ",") {
		coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(coding), "gzip") {
			continue
		}
		q, found := strings.CutPrefix(strings.ReplaceAll(params, " ", ""), "q=")
		if found {
			if v, err := strconv.ParseFloat(q, 64); err == nil && v == 0 {
				return false
			}
		}
		return true
	}
	return false
}

// etagMatch reports whether an If-None-Match header names either form of tag
// (weak comparison, as RFC 9110 asks for If-None-Match).
func etagMatch(header, tag string) bool {
	for part := range strings.SplitSeq(header, ",") {
		t := strings.TrimPrefix(strings.TrimSpace(part), "W/")
		if t == "*" || t == `"`+tag+`"` || t == `"`+tag+`-gz"` {
			return true
		}
	}
	return false
}
