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

// WriteFileOutput is write_file's structured result.
type WriteFileOutput struct {
	Path string `json:"path" jsonschema:"the file written, relative to /workspace"`
	Size int    `json:"size" jsonschema:"bytes written"`
	URI  string `json:"uri" jsonschema:"the file as a resource, for resources/read"`
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
// /workspace. Sessions are opened by create_session, or by execute_code
// with a new session_id.
func (t *tools) addFileTools(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{
		Name:        "write_file",
		Title:       "Write a file",
		Description: "Write a text file into a session's /workspace, replacing any file of that name (parent directories are created). Use the same session_id with execute_code to work on it.",
		Annotations: &mcp.ToolAnnotations{IdempotentHint: true, DestructiveHint: new(true), OpenWorldHint: new(false)},
	}, t.writeFile)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "read_file",
		Title:       "Read a file",
		Description: "Read a text file from a session's /workspace.",
		Annotations: readOnly(),
	}, t.readFile)
	mcp.AddTool(s, &mcp.Tool{
		Name:        "list_files",
		Title:       "List files",
		Description: "List one directory of a session's /workspace.",
		Annotations: readOnly(),
	}, t.listFiles)
}

func (t *tools) writeFile(ctx context.Context, req *mcp.CallToolRequest, in WriteFileInput) (*mcp.CallToolResult, WriteFileOutput, error) {
	b, id, err := t.open(ctx, header(req))
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	if err := b.WriteFile(ctx, in.SessionID, &executionv1.File{Path: in.Path, Content: []byte(in.Content)}); err != nil {
		return nil, WriteFileOutput{}, failed(id, err)
	}
	t.runs.useSession(req.Session, in.SessionID)
	out := WriteFileOutput{Path: in.Path, Size: len(in.Content), URI: fileURI(in.SessionID, in.Path)}
	return &mcp.CallToolResult{Content: text(fmt.Sprintf("wrote %d bytes to /workspace/%s", len(in.Content), in.Path))}, out, nil
}

func (t *tools) readFile(ctx context.Context, req *mcp.CallToolRequest, in ReadFileInput) (*mcp.CallToolResult, FileOutput, error) {
	b, id, err := t.open(ctx, header(req))
	if err != nil {
		return nil, FileOutput{}, err
	}
	f, err := b.ReadFile(ctx, in.SessionID, in.Path)
	if err != nil {
		return nil, FileOutput{}, failed(id, err)
	}
	content := f.GetContent()
	if !utf8.Valid(content) {
		return nil, FileOutput{}, fmt.Errorf("/workspace/%s is not UTF-8 text (%d bytes); read it with execute_code, e.g. base64", in.Path, len(content))
	}
	out := FileOutput{Path: in.Path, Content: string(content), Size: len(content)}
	return &mcp.CallToolResult{Content: text(out.Content)}, out, nil
}

func (t *tools) listFiles(ctx context.Context, req *mcp.CallToolRequest, in ListFilesInput) (*mcp.CallToolResult, ListFilesOutput, error) {
	b, id, err := t.open(ctx, header(req))
	if err != nil {
		return nil, ListFilesOutput{}, err
	}
	files, truncated, err := b.ListFiles(ctx, in.SessionID, in.Path)
	if err != nil {
		return nil, ListFilesOutput{}, failed(id, err)
	}
	out := ListFilesOutput{Files: []FileEntry{}, Truncated: truncated}
	var sb strings.Builder
	for _, f := range files {
		out.Files = append(out.Files, FileEntry{Path: f.GetPath(), Size: f.GetSize(), Dir: f.GetDir()})
		if f.GetDir() {
			fmt.Fprintf(&sb, "%s/\n", f.GetPath())
		} else {
			fmt.Fprintf(&sb, "%s\t%d bytes\n", f.GetPath(), f.GetSize())
		}
	}
	if truncated {
		sb.WriteString("[listing truncated]\n")
	}
	if sb.Len() == 0 {
		sb.WriteString("[empty]")
	}
	return &mcp.CallToolResult{Content: text(sb.String())}, out, nil
}
