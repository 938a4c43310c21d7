package apicatalog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
)

// Tool is one declared tool: one HTTP request to its API whose path, query
// and body are templates filled in from the call's arguments. In a
// template, {name} stands for the argument name, which the tool's
// parameters must declare with a type (string, integer, number or boolean;
// a body's whole-string placeholder may have any type):
//
//   - In the path, an argument is escaped as part of one segment ('/'
//     becomes %2F), so it cannot leave the segment; the schema must
//     require it or give it a default, and a segment may not come out as
//     "", "." or "..".
//   - A query parameter whose template names an argument that is absent
//     is left out; other arguments are written as text (numbers in
//     decimal, booleans as true and false) and escaped.
//   - In the body (JSON), a string that is exactly one placeholder becomes
//     the argument's JSON value; a string with other text becomes text; an
//     object member or array element whose string names an absent argument
//     is left out.
//
// Arguments are checked against the parameters' JSON Schema, with the
// schema's defaults filled in first.
type Tool struct {
	// API is the tool's API.
	API *API
	// Name, Title and Description are as declared.
	Name, Title, Description string
	// Method is the HTTP method.
	Method string
	// Path is the path template as declared.
	Path string
	// ReadOnly says that a call changes nothing.
	ReadOnly bool

	parameters json.RawMessage
	schema     *jsonschema.Resolved
	path       template
	query      []queryParam // sorted by name
	body       any          // decoded with UseNumber; nil: no body
}

type queryParam struct {
	name  string
	value template
}

// ErrArguments is wrapped by the errors of arguments that do not fit a
// tool.
var ErrArguments = errors.New("invalid arguments")

var methods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

func newTool(a *API, d ToolDeclaration) (*Tool, error) {
	t := &Tool{API: a, Name: d.Name, Title: strings.TrimSpace(d.Title), Description: strings.TrimSpace(d.Description),
		Method: strings.ToUpper(d.Method), Path: d.Path}
	c := &toolCheck{api: a.Name, tool: d.Name}
	c.describe(t, d)
	if !c.parameters(t, d.Parameters) {
		return nil, errors.Join(c.errs...)
	}
	c.path(t, d.Path)
	c.query(t, d.Query)
	c.body(t, d.Body)
	if err := errors.Join(c.errs...); err != nil {
		return nil, err
	}
	return t, nil
}

// toolCheck reads one tool's declaration into its Tool, gathering every
// problem it finds, each named with the API and the tool.
type toolCheck struct {
	api, tool string
	// schema is the tool's parameters, once read.
	schema jsonschema.Schema
	errs   []error
}

func (c *toolCheck) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("api %s: tool %s: "+format, append([]any{c.api, c.tool}, args...)...))
}

// describe checks the tool's name, description and method, and sets
// whether it is read-only.
func (c *toolCheck) describe(t *Tool, d ToolDeclaration) {
	if !toolNamePattern.MatchString(d.Name) || !strings.HasPrefix(d.Name, c.api+"_") || len(d.Name) == len(c.api)+1 {
		c.fail("the name must start with %q and then match %s", c.api+"_", toolNamePattern)
	}
	if t.Description == "" {
		c.fail("no description: a model reads it to choose the tool")
	}
	if t.Method == "" {
		t.Method = http.MethodGet
	}
	if !slices.Contains(methods, t.Method) {
		c.fail("method %q: want one of %s", d.Method, strings.Join(methods, ", "))
	}
	t.ReadOnly = t.Method == http.MethodGet
	if d.ReadOnly != nil {
		t.ReadOnly = *d.ReadOnly
	}
}

// parameters reads the parameters' JSON Schema (none: no parameters) and
// reports whether it could be decoded at all; the other checks need it.
func (c *toolCheck) parameters(t *Tool, parameters json.RawMessage) bool {
	t.parameters = parameters
	if len(bytes.TrimSpace(t.parameters)) == 0 {
		t.parameters = json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`)
	}
	if err := json.Unmarshal(t.parameters, &c.schema); err != nil {
		c.fail("parameters: %v", err)
		return false
	}
	if c.schema.Type != "object" {
		c.fail(`parameters: the schema's type must be "object"`)
	}
	var err error
	if t.schema, err = c.schema.Resolve(&jsonschema.ResolveOptions{ValidateDefaults: true}); err != nil {
		c.fail("parameters: %v", err)
	}
	return true
}

// argument checks that a template's argument name is declared, and, if
// needScalar, with a type that a template can write as text.
func (c *toolCheck) argument(where, name string, needScalar bool) {
	p, ok := c.schema.Properties[name]
	if !ok {
		c.fail("%s names {%s}, which is not among the parameters' properties", where, name)
		return
	}
	if !needScalar {
		return
	}
	types := p.Types
	if p.Type != "" {
		types = []string{p.Type}
	}
	if len(types) == 0 {
		c.fail("%s names {%s}, whose schema has no type: give it string, integer, number or boolean", where, name)
	}
	for _, ty := range types {
		if !slices.Contains([]string{"string", "integer", "number", "boolean", "null"}, ty) {
			c.fail("%s names {%s} of type %s: only string, integer, number and boolean can be written into it", where, name, ty)
		}
	}
}

// path reads the path template: an escaped URL path without dot segments,
// whose arguments are required or have a default.
func (c *toolCheck) path(t *Tool, path string) {
	switch {
	case !strings.HasPrefix(path, "/"):
		c.fail("path %q does not start with /", path)
		return
	case strings.ContainsAny(path, "?#"):
		c.fail("path %q: put the query in \"query\"", path)
		return
	}
	var err error
	if t.path, err = parseTemplate(path); err != nil {
		c.fail("path: %v", err)
		return
	}
	for _, p := range t.path {
		if p.name == "" {
			continue
		}
		c.argument("the path", p.name, true)
		if prop := c.schema.Properties[p.name]; !slices.Contains(c.schema.Required, p.name) && prop != nil && prop.Default == nil {
			c.fail("the path names {%s}, which the parameters neither require nor give a default", p.name)
		}
	}
	var lit strings.Builder
	for _, p := range t.path {
		if p.name != "" {
			lit.WriteString("x")
		}
		lit.WriteString(p.lit)
	}
	u, err := url.Parse(lit.String())
	if err != nil || u.Host != "" || u.EscapedPath() != lit.String() {
		c.fail("path %q is not an escaped URL path", path)
		return
	}
	if hasDotSegment(u) {
		c.fail("path %q has dot segments", path)
	}
}

// query reads the query parameters' templates, sorted by name.
func (c *toolCheck) query(t *Tool, query map[string]string) {
	for name, v := range query {
		if name == "" {
			c.fail("query: a parameter with no name")
			continue
		}
		tpl, err := parseTemplate(v)
		if err != nil {
			c.fail("query parameter %s: %v", name, err)
			continue
		}
		for _, p := range tpl {
			if p.name != "" {
				c.argument("query parameter "+name, p.name, true)
			}
		}
		t.query = append(t.query, queryParam{name: name, value: tpl})
	}
	slices.SortFunc(t.query, func(a, b queryParam) int { return strings.Compare(a.name, b.name) })
}

// body reads the body's JSON template, for a method that has a body.
func (c *toolCheck) body(t *Tool, body json.RawMessage) {
	if len(bytes.TrimSpace(body)) == 0 {
		return
	}
	switch t.Method {
	case http.MethodPost, http.MethodPut, http.MethodPatch:
	default:
		c.fail("a %s request has no body", t.Method)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&t.body); err != nil {
		c.fail("body: %v", err)
		return
	}
	err := walkBody(t.body, func(tpl template) {
		if name, ok := tpl.single(); ok {
			c.argument("the body", name, false)
			return
		}
		for _, p := range tpl {
			if p.name != "" {
				c.argument("the body", p.name, true)
			}
		}
	})
	if err != nil {
		c.fail("body: %v", err)
	}
}

// InputSchema returns the JSON Schema of the tool's arguments, as declared.
func (t *Tool) InputSchema() json.RawMessage { return bytes.Clone(t.parameters) }

// Call is one call of a tool with its arguments: the request to make.
type Call struct {
	Tool *Tool
	// Method and URL of the request, the arguments filled in.
	Method string
	URL    *url.URL
	// Body is the request's JSON body; nil for none.
	Body []byte
	// Arguments are the call's arguments as a JSON object, with the
	// schema's defaults filled in.
	Arguments json.RawMessage
}

// NewCall checks args (a JSON object; empty means {}) against the tool's
// parameters and fills in its templates. Its errors wrap [ErrArguments] and
// say what is wrong.
func (t *Tool) NewCall(args json.RawMessage) (*Call, error) {
	bad := func(err error) error { return fmt.Errorf("%w for %s: %w", ErrArguments, t.Name, err) }
	m := map[string]any{}
	if len(bytes.TrimSpace(args)) > 0 && string(bytes.TrimSpace(args)) != "null" {
		if err := json.Unmarshal(args, &m); err != nil {
			return nil, bad(errors.New("the arguments are not a JSON object"))
		}
		if m == nil {
			m = map[string]any{}
		}
	}
	if err := t.schema.ApplyDefaults(&m); err != nil {
		return nil, bad(err)
	}
	if err := t.schema.Validate(m); err != nil {
		return nil, bad(err)
	}
	c := &Call{Tool: t, Method: t.Method}
	path, err := t.fillPath(m)
	if err != nil {
		return nil, bad(err)
	}
	q := url.Values{}
	for _, p := range t.query {
		v, ok, err := p.value.fill(m, nil, false)
		if err != nil {
			return nil, bad(err)
		}
		if ok {
			q.Set(p.name, v)
		}
	}
	if c.URL, err = t.API.URL(path, q.Encode()); err != nil {
		return nil, bad(err)
	}
	if t.body != nil {
		body, ok, err := fillBody(t.body, m)
		if err != nil {
			return nil, bad(err)
		}
		if ok {
			if c.Body, err = json.Marshal(body); err != nil {
				return nil, bad(err)
			}
		}
	}
	if c.Arguments, err = json.Marshal(m); err != nil {
		return nil, bad(err)
	}
	return c, nil
}

// fillPath fills the path template with args, each escaped as part of
// one segment; a segment with a placeholder may not come out empty, "."
// or "..", which would change the path's shape.
func (t *Tool) fillPath(args map[string]any) (string, error) {
	path, ok, err := t.path.fill(args, url.PathEscape, false)
	if err != nil {
		return "", err
	}
	if !ok {
		return "", errors.New("the path lacks an argument") // the schema requires them all
	}
	declared, filled := strings.Split(t.Path, "/"), strings.Split(path, "/")
	for i := range min(len(declared), len(filled)) {
		if strings.Contains(declared[i], "{") {
			switch filled[i] {
			case "", ".", "..":
				return "", fmt.Errorf("%q cannot be a segment of the path %s", filled[i], t.Path)
			}
		}
	}
	return path, nil
}

// Request returns the HTTP request of c, with the API's headers and
// credential (see API.Header: never log them) and, with a body,
// Content-Type application/json.
func (c *Call) Request(ctx context.Context) (*http.Request, error) {
	h, err := c.Tool.API.Header(ctx)
	if err != nil {
		return nil, err
	}
	var body io.Reader
	if c.Body != nil {
		body = bytes.NewReader(c.Body)
	}
	req, err := http.NewRequestWithContext(ctx, c.Method, c.URL.String(), body)
	if err != nil {
		return nil, fmt.Errorf("api %s: %w", c.Tool.API.Name, err)
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	if c.Body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	return req, nil
}
