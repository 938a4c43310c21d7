// Package apicatalog is the catalog of HTTP APIs that codemode offers to models,
// read from a JSON declaration. The edge turns each declared tool into an
// MCP tool on /mcp-no-code-execute and makes its calls; code in a sandbox
// reaches the same APIs by the plain-HTTP name http://NAME.api.codemode/
// (see [HostSuffix]), which is forwarded to the API's base URL with its
// headers and credential added outside the sandbox.
//
// A declaration (the shipped one is github.json; examples/msgraph.json is
// another):
//
//	{"apis": [{
//	  "name": "github",
//	  "description": "GitHub's REST API",
//	  "base_url": "https://api.github.com",
//	  "headers": {"Accept": "application/vnd.github+json"},
//	  "credential": {"header": "Authorization", "prefix": "Bearer ",
//	                 "secret_env": "CODEMODE_GITHUB_TOKEN", "optional": true,
//	                 "refuse_echo": false},
//	  "tools": [{
//	    "name": "github_list_user_repos",
//	    "description": "List a user's public repositories.",
//	    "method": "GET",
//	    "path": "/users/{username}/repos",
//	    "query": {"sort": "{sort}", "per_page": "{per_page}"},
//	    "parameters": {"type": "object", "properties": {...}, "required": ["username"]}
//	  }]
//	}]}
//
// Templates (path, query values, string values of body) name the tool's
// arguments in braces; see [Tool] for how they are filled in. Everything is
// checked at load: a declaration that loads makes only well-formed requests.
//
// # Secrets
//
// A credential's secret is read from an environment variable or a file each
// time a request is made (so a rotated token file takes effect at once). It
// is never kept in a struct, logged, or written into an error message. An
// answer that echoes it, raw or encoded, has it redacted by a [Redactor]
// (or is refused, for a credential declared with refuse_echo) before it
// reaches a caller or a sandbox; errors name an API, never its base URL.
//
// # Concurrency
//
// A Catalog and everything in it are immutable once loaded and safe for
// concurrent use.
package apicatalog

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
)

// HostSuffix ends the host name by which code in a sandbox addresses a
// declared API: http://github.api.codemode/users/octocat/repos reaches the
// API named github.
const HostSuffix = ".api.codemode"

// Catalog is a set of declared APIs. The zero value and nil declare none.
type Catalog struct {
	apis   []*API
	byName map[string]*API
	tools  map[string]*Tool
}

// Declaration is the JSON form of a catalog file.
type Declaration struct {
	APIs []APIDeclaration `json:"apis"`
}

// APIDeclaration declares one API.
type APIDeclaration struct {
	// Name is lower case letters, digits and '-', starting with a letter,
	// at most 31 long: it is a DNS label in NAME.api.codemode.
	Name string `json:"name"`
	// Description says what the API is, for models (one line).
	Description string `json:"description,omitempty"`
	// BaseURL is an absolute http or https URL with no query or fragment;
	// a path (https://graph.microsoft.com/v1.0) is kept in front of every
	// request's path.
	BaseURL string `json:"base_url"`
	// Headers are sent with every request to the API.
	Headers map[string]string `json:"headers,omitempty"`
	// Credential, if set, adds a secret to every request.
	Credential *Credential `json:"credential,omitempty"`
	// Tools are the MCP tools offered for the API.
	Tools []ToolDeclaration `json:"tools,omitempty"`
}

// ToolDeclaration declares one tool: one HTTP request.
type ToolDeclaration struct {
	// Name starts with the API's name and '_' (github_list_user_repos);
	// then lower case letters, digits, '_' and '-'; at most 64 long; unique
	// in the catalog.
	Name string `json:"name"`
	// Title is a short human-readable name; optional.
	Title string `json:"title,omitempty"`
	// Description tells a model what the tool does and returns.
	Description string `json:"description"`
	// Method is GET, POST, PUT, PATCH or DELETE; GET when empty.
	Method string `json:"method,omitempty"`
	// Path is the path template below the base URL, starting with '/'.
	Path string `json:"path"`
	// Query maps query parameters to value templates.
	Query map[string]string `json:"query,omitempty"`
	// Body is the JSON body template of a POST, PUT or PATCH.
	Body json.RawMessage `json:"body,omitempty"`
	// Parameters is the JSON Schema of the arguments: an object schema
	// whose properties the templates name. Empty: no arguments.
	Parameters json.RawMessage `json:"parameters,omitempty"`
	// ReadOnly says that the call changes nothing (true by default for
	// GET); it sets the MCP tool's read-only annotation.
	ReadOnly *bool `json:"read_only,omitempty"`
}

// Option changes how a declaration is loaded.
type Option func(*options)

type options struct {
	getenv   func(string) string
	baseURLs map[string]string
}

// WithGetenv reads credentials' environment variables with getenv instead
// of os.Getenv.
func WithGetenv(getenv func(string) string) Option {
	return func(o *options) { o.getenv = getenv }
}

// WithBaseURL replaces the base URL of the API named api, for example to
// point a declaration at a test server or a mirror. The URL is checked
// like a declared one; naming an API the declaration lacks is an error.
func WithBaseURL(api, baseURL string) Option {
	return func(o *options) {
		if o.baseURLs == nil {
			o.baseURLs = map[string]string{}
		}
		o.baseURLs[api] = baseURL
	}
}

// Load reads and checks the declaration file at path.
func Load(path string, opts ...Option) (*Catalog, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read api declaration: %w", err)
	}
	c, err := Parse(b, opts...)
	if err != nil {
		return nil, fmt.Errorf("api declaration %s: %w", path, err)
	}
	return c, nil
}

//go:embed github.json
var defaultDeclaration []byte

// DefaultDeclaration returns the shipped declaration (github.json): the
// four tools of GitHub's public API the original offered. Its credential,
// CODEMODE_GITHUB_TOKEN, is optional.
func DefaultDeclaration() []byte { return bytes.Clone(defaultDeclaration) }

// None, given to [FromFlag], declares no APIs.
const None = "none"

// FromFlag returns the catalog a service's --apis flag names: the shipped
// declaration ([Default]) for "", none for [None], else the file's.
func FromFlag(path string, opts ...Option) (*Catalog, error) {
	switch path {
	case "":
		return Default(), nil
	case None:
		return &Catalog{}, nil
	}
	return Load(path, opts...)
}

// Default returns the catalog of the shipped declaration.
func Default() *Catalog {
	c, err := Parse(defaultDeclaration)
	if err != nil {
		panic("apis: the shipped declaration does not load: " + err.Error()) // a test loads it
	}
	return c
}

// Parse checks a declaration and returns its catalog. Every problem found
// is reported, each naming the API and tool it is in.
func Parse(b []byte, opts ...Option) (*Catalog, error) {
	o := options{getenv: os.Getenv}
	for _, opt := range opts {
		opt(&o)
	}
	var d Declaration
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if dec.More() {
		return nil, errors.New("parse: data after the declaration")
	}
	c := &Catalog{byName: map[string]*API{}, tools: map[string]*Tool{}}
	var errs []error
	for i := range d.APIs {
		ad := d.APIs[i]
		if u, ok := o.baseURLs[ad.Name]; ok {
			ad.BaseURL = u
		}
		a, err := newAPI(ad, o.getenv)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if _, dup := c.byName[a.Name]; dup {
			errs = append(errs, fmt.Errorf("api %s: declared twice", a.Name))
			continue
		}
		c.byName[a.Name] = a
		c.apis = append(c.apis, a)
		for _, t := range a.Tools {
			if _, dup := c.tools[t.Name]; dup {
				errs = append(errs, fmt.Errorf("api %s: tool %s: the name is taken by another tool", a.Name, t.Name))
				continue
			}
			c.tools[t.Name] = t
		}
	}
	for name := range o.baseURLs {
		if !slices.ContainsFunc(d.APIs, func(a APIDeclaration) bool { return a.Name == name }) {
			errs = append(errs, fmt.Errorf("base URL given for api %q, which is not declared", name))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// APIs returns the declared APIs in declaration order.
func (c *Catalog) APIs() []*API {
	if c == nil {
		return nil
	}
	return c.apis
}

// Lookup returns the API named name.
func (c *Catalog) Lookup(name string) (*API, bool) {
	if c == nil {
		return nil, false
	}
	a, ok := c.byName[name]
	return a, ok
}

// ByHost returns the API that code addresses as host: NAME.api.codemode,
// with or without a port or a final dot, in any case.
func (c *Catalog) ByHost(host string) (*API, bool) {
	if h, port, ok := strings.Cut(host, ":"); ok && !strings.Contains(port, ":") {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	name, ok := strings.CutSuffix(host, HostSuffix)
	if !ok {
		return nil, false
	}
	return c.Lookup(name)
}

// Tool returns the tool named name.
func (c *Catalog) Tool(name string) (*Tool, bool) {
	if c == nil {
		return nil, false
	}
	t, ok := c.tools[name]
	return t, ok
}

// API is one declared API.
type API struct {
	// Name is the API's name (see APIDeclaration.Name).
	Name string
	// Description says what the API is.
	Description string
	// BaseURL is where requests go; its path, if any, ends without '/'.
	BaseURL *url.URL
	// Tools are the API's tools in declaration order.
	Tools []*Tool

	header http.Header
	cred   *Credential
	getenv func(string) string
}

var (
	apiNamePattern  = regexp.MustCompile(`^[a-z][a-z0-9-]{0,30}$`)
	toolNamePattern = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,63}$`)
)

func newAPI(d APIDeclaration, getenv func(string) string) (*API, error) {
	if !apiNamePattern.MatchString(d.Name) {
		return nil, fmt.Errorf("api %q: the name must match %s (it is a host name label)", d.Name, apiNamePattern)
	}
	a := &API{Name: d.Name, Description: strings.TrimSpace(d.Description), header: http.Header{}, getenv: getenv}
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("api %s: "+format, append([]any{d.Name}, args...)...))
	}
	u, err := parseBaseURL(d.BaseURL)
	if err != nil {
		fail("base_url: %v", err)
	}
	a.BaseURL = u
	for k, v := range d.Headers {
		if err := checkHeader(k, v); err != nil {
			fail("headers: %v", err)
			continue
		}
		a.header.Set(k, v)
	}
	if d.Credential != nil {
		cr := *d.Credential
		if err := cr.check(getenv); err != nil {
			fail("credential: %w", err)
		}
		if a.header.Get(cr.Header) != "" {
			fail("credential: header %s is also among the headers", cr.Header)
		}
		a.cred = &cr
	}
	for _, td := range d.Tools {
		t, err := newTool(a, td)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		a.Tools = append(a.Tools, t)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return a, nil
}

func parseBaseURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil, err
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%q: want an absolute http:// or https:// URL", s)
	case u.Host == "" || u.Opaque != "":
		return nil, fmt.Errorf("%q: no host", s)
	case u.User != nil:
		return nil, fmt.Errorf("%q: user information does not belong in a base URL; declare a credential", s)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return nil, fmt.Errorf("%q: a base URL has no query or fragment", s)
	}
	if hasDotSegment(u) {
		return nil, fmt.Errorf("%q: dot segments in the path", s)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = strings.TrimRight(u.RawPath, "/")
	return u, nil
}

// Host returns the host name code uses for the API: NAME.api.codemode.
func (a *API) Host() string { return a.Name + HostSuffix }

// URL returns where a request that code sent to http://NAME.api.codemode
// with the escaped path escapedPath and the query rawQuery goes: the base
// URL with escapedPath added to its path.
func (a *API) URL(escapedPath, rawQuery string) (*url.URL, error) {
	if escapedPath == "" {
		escapedPath = "/"
	}
	if !strings.HasPrefix(escapedPath, "/") {
		return nil, fmt.Errorf("path %q does not start with /", escapedPath)
	}
	u, err := url.Parse(strings.TrimSuffix(a.BaseURL.String(), "/") + escapedPath)
	if err != nil {
		return nil, fmt.Errorf("path %q: %w", escapedPath, err)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.Host != a.BaseURL.Host {
		return nil, fmt.Errorf("path %q is not a path", escapedPath)
	}
	if hasDotSegment(u) {
		return nil, fmt.Errorf("path %q has dot segments", escapedPath)
	}
	u.RawQuery = rawQuery
	return u, nil
}

// hasDotSegment reports whether a segment of u's path is "." or "..",
// escaped or not (a server may unescape before it resolves them).
func hasDotSegment(u *url.URL) bool {
	for _, seg := range strings.Split(u.EscapedPath(), "/") {
		if s, err := url.PathUnescape(seg); err == nil && (s == "." || s == "..") {
			return true
		}
	}
	return false
}
