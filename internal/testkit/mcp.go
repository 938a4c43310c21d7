package testkit

import (
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ToolText returns the text of res's text contents, joined; "" for a nil
// result.
func ToolText(res *mcp.CallToolResult) string {
	if res == nil {
		return ""
	}
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
