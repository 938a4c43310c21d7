package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/codemode-go/codemode/edge/internal/directtools"
	"github.com/codemode-go/codemode/internal/apicatalog"
)

// maxErrorExcerpt bounds how much of an error answer's body a tool error
// quotes.
const maxErrorExcerpt = 2 << 10

// APIOutput is the structured result of a declared API tool.
type APIOutput struct {
	// Status is the HTTP status code.
	Status int `json:"status" jsonschema:"the HTTP status of the API's answer"`
	// Body is the answer's JSON, when it is JSON and whole.
	Body json.RawMessage `json:"body,omitempty" jsonschema:"the answer's JSON, when it is JSON and was not cut"`
	// Text is the answer as text otherwise.
	Text string `json:"text,omitempty" jsonschema:"the answer as text when it is not JSON or was cut, or what became of it"`
	// Truncated says the answer was cut.
	Truncated bool `json:"truncated,omitempty" jsonschema:"the answer went over the size limit and was cut"`
}

// apiOutputSchema is APIOutput's schema, with body any JSON value.
func apiOutputSchema() *jsonschema.Schema {
	s, err := jsonschema.For[APIOutput](nil)
	if err != nil {
		panic(err) // the type is this package's own
	}
	s.Properties["body"] = &jsonschema.Schema{Description: s.Properties["body"].Description}
	return s
}

// addAPITools adds one tool per tool of c's APIs: the tool's name,
// description and argument schema as declared; read-only tools are
// read-only and idempotent; all reach the open world.
func (t *tools) addAPITools(s *mcp.Server, c *apicatalog.Catalog) {
	out := apiOutputSchema()
	for _, a := range c.APIs() {
		for _, tool := range a.Tools {
			ann := &mcp.ToolAnnotations{ReadOnlyHint: tool.ReadOnly, IdempotentHint: tool.ReadOnly, OpenWorldHint: new(true)}
			if !tool.ReadOnly {
				ann.IdempotentHint = tool.Method == http.MethodPut || tool.Method == http.MethodDelete
			}
			s.AddTool(&mcp.Tool{
				Name:         tool.Name,
				Title:        tool.Title,
				Description:  tool.Description,
				InputSchema:  tool.InputSchema(),
				OutputSchema: out,
				Annotations:  ann,
			}, t.callAPI(tool))
		}
	}
}

// callAPI returns the handler of tool. Whatever goes wrong comes back as a
// result with isError, for the model to read: arguments that do not fit,
// limits, a policy's denial, an API that cannot be reached, and an answer
// with an error status (quoting the start of its body).
func (t *tools) callAPI(tool *apicatalog.Tool) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		b, id, err := t.open(ctx, header(req))
		if err != nil {
			return errorResult(err), nil
		}
		res, err := b.CallAPI(ctx, tool, req.Params.Arguments)
		if err != nil {
			return withRequestID(errorResult(failed(id, err)), id), nil
		}
		return withRequestID(apiResult(tool, res), id), nil
	}
}

func errorResult(err error) *mcp.CallToolResult {
	res := &mcp.CallToolResult{}
	res.SetError(err)
	return res
}

// apiResult renders an answer for a model: a JSON body indented, as text
// and as structured content; other text as it is; a cut body with a note
// saying so.
func apiResult(tool *apicatalog.Tool, res *directtools.Response) *mcp.CallToolResult {
	if res.Status >= 400 {
		// The API's name and the path below its base URL: its address is
		// the operator's, not the caller's.
		msg := fmt.Sprintf("%s answered %s to %s %s", tool.API.Name, res.StatusText, res.Method, res.Path)
		if excerpt := bytes.TrimSpace(res.Body); len(excerpt) > 0 {
			more := ""
			if len(excerpt) > maxErrorExcerpt {
				excerpt, more = cutText(excerpt, maxErrorExcerpt), "..."
			}
			msg += ": " + bodyText(excerpt, res.ContentType) + more
		}
		return &mcp.CallToolResult{Content: text(msg), IsError: true}
	}
	out := &mcp.CallToolResult{}
	structured := APIOutput{Status: res.Status, Truncated: res.Truncated}
	var body string
	switch {
	case res.Location != "":
		body = fmt.Sprintf("[%s: redirected to %s, which leaves the API and was not followed]", res.StatusText, res.Location)
	case len(res.Body) == 0:
		body = fmt.Sprintf("[%s, empty body]", res.StatusText)
	case !res.Truncated && json.Valid(res.Body):
		var pretty bytes.Buffer
		if json.Indent(&pretty, res.Body, "", "  ") == nil {
			body = pretty.String()
		} else {
			body = string(res.Body)
		}
		structured.Body = res.Body
	default:
		body = bodyText(res.Body, res.ContentType)
	}
	if res.Truncated {
		body += fmt.Sprintf("\n[the answer was cut at %d bytes; ask for less, e.g. a smaller page]", len(res.Body))
	}
	out.Content = text(body)
	if structured.Body == nil {
		structured.Text = body
	}
	out.StructuredContent = structured
	return out
}

// bodyText is a body as a model reads it: the text, or what it is when it
// is not text.
func bodyText(b []byte, contentType string) string {
	if utf8.Valid(b) {
		return string(b)
	}
	if contentType == "" {
		contentType = "binary data"
	}
	return fmt.Sprintf("[%d bytes of %s]", len(b), contentType)
}

// cutText returns at most n bytes of b, not ending in part of a UTF-8
// sequence.
func cutText(b []byte, n int) []byte {
	b = b[:min(len(b), n)]
	for i := 1; i < utf8.UTFMax && len(b) > 0; i++ {
		if r, size := utf8.DecodeLastRune(b); r != utf8.RuneError || size != 1 {
			break
		}
		b = b[:len(b)-1]
	}
	return b
}

// apisText tells a model which declared APIs code can reach, and how.
func apisText(list []*apicatalog.API) string {
	if len(list) == 0 {
		return ""
	}
	var names []string
	for _, a := range list {
		n := fmt.Sprintf("http://%s/ for %s", a.Host(), a.BaseURL)
		if a.Description != "" {
			n += " (" + a.Description + ")"
		}
		names = append(names, n)
	}
	return fmt.Sprintf(" Declared APIs can be reached despite the missing network, where the tenant's egress allows: %s. "+
		"Use plain HTTP to that host (e.g. GET http://%s/<path>); codemode forwards each request over TLS and adds the credential, so send none.",
		strings.Join(names, "; "), list[0].Host())
}
