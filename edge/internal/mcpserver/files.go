package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// WriteFileInput is write_file's input.
type WriteFileInput struct {
	SessionID string `json:"session_id" jsonschema:"the session whose /workspace receives the file"`
	Path      string `json:"path" jsonschema:"path relative to /workspace, e.g. data/input.csv"`
	Content   string `json:"content" jsonschema:"the file's text"`
}

// ReadFileInput is read_file's input.
type ReadFileInput struct {
	SessionID string `json:"session_id" jsonschema:"the session whose /workspace holds the file"`
	Path      string `json:"path" jsonschema:"path relative to /workspace"`
}

// ListFilesInput is list_files's input.
type ListFilesInput struct {
	SessionID string `json:"session_id" jsonschema:"the session whose /workspace to list"`
	Path      string `json:"path,omitempty" jsonschema:"directory relative to /workspace; omit for /workspace itself"`
}

// FileOutput is read_file's structured result.
type FileOutput struct {
	Path    string `json:"path"`
	Content string `json:"content"`
	Size    int    `json:"size"`
}

// ListFilesOutput is list_files's structured result.
type ListFilesOutput struct {
	Files     []FileEntry `json:"files"`
	Truncated bool        `json:"truncated,omitempty"`
}

// FileEntry is one entry of a listing.
type FileEntry struct {
	Path string `json:"path"`
	Size uint64 `json:"size"`
	Dir  bool   `json:"dir,omitempty"`
}

// addFileTools adds the tools that move files in and out of a session's
// /workspace. Sessions are opened by execute_code with a session_id.
func (a *adapter) addFileTools(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{
		Name:        "write_file",
		Title:       "Write a file",
		Description: "Write a text file into a session's /workspace (parent directories are created). Use the same session_id with execute_code to work on it.",
	}, a.writeFile)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "read_file",
		Title:       "Read a file",
		Description: "Read a text file from a session's /workspace.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, a.readFile)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "list_files",
		Title:       "List files",
		Description: "List one directory of a session's /workspace.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, a.listFiles)
}

func (a *adapter) writeFile(ctx context.Context, req *mcp.CallToolRequest, in WriteFileInput) (*mcp.CallToolResult, any, error) {
	c, err := a.caller(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	if err := a.svc.WriteFile(ctx, c, in.SessionID, &executionv1.File{Path: in.Path, Content: []byte(in.Content)}); err != nil {
		return nil, nil, failed(c, err)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("wrote %d bytes to /workspace/%s", len(in.Content), in.Path)}}}, nil, nil
}

func (a *adapter) readFile(ctx context.Context, req *mcp.CallToolRequest, in ReadFileInput) (*mcp.CallToolResult, FileOutput, error) {
	c, err := a.caller(ctx, req)
	if err != nil {
		return nil, FileOutput{}, err
	}
	f, err := a.svc.ReadFile(ctx, c, in.SessionID, in.Path, 0)
	if err != nil {
		return nil, FileOutput{}, failed(c, err)
	}
	content := f.GetContent()
	if !utf8.Valid(content) {
		return nil, FileOutput{}, fmt.Errorf("/workspace/%s is not UTF-8 text (%d bytes); read it with execute_code, e.g. base64", in.Path, len(content))
	}
	out := FileOutput{Path: in.Path, Content: string(content), Size: len(content)}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: out.Content}}}, out, nil
}

func (a *adapter) listFiles(ctx context.Context, req *mcp.CallToolRequest, in ListFilesInput) (*mcp.CallToolResult, ListFilesOutput, error) {
	c, err := a.caller(ctx, req)
	if err != nil {
		return nil, ListFilesOutput{}, err
	}
	files, truncated, err := a.svc.ListFiles(ctx, c, in.SessionID, in.Path)
	if err != nil {
		return nil, ListFilesOutput{}, failed(c, err)
	}
	out := ListFilesOutput{Files: []FileEntry{}, Truncated: truncated}
	var b strings.Builder
	for _, f := range files {
		out.Files = append(out.Files, FileEntry{Path: f.GetPath(), Size: f.GetSize(), Dir: f.GetDir()})
		if f.GetDir() {
			fmt.Fprintf(&b, "%s/\n", f.GetPath())
		} else {
			fmt.Fprintf(&b, "%s\t%d bytes\n", f.GetPath(), f.GetSize())
		}
	}
	if truncated {
		b.WriteString("[listing truncated]\n")
	}
	if b.Len() == 0 {
		b.WriteString("[empty]")
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: b.String()}}}, out, nil
}
