package e2e

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/testkit"
)

func TestSessionFiles(t *testing.T) {
	t.Parallel()
	s := shared(t)
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	sess, err := c.CreateSession(t.Context(), connect.NewRequest(&edgev1.CreateSessionRequest{Language: "python"}))
	if err != nil {
		t.Fatal(err)
	}
	id := sess.Msg.GetSession().GetId()
	t.Cleanup(func() {
		c.CloseSession(context.Background(), connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: id}))
	})

	if _, err := c.WriteFile(t.Context(), connect.NewRequest(&edgev1.WriteFileRequest{
		SessionId: id, File: &executionv1.File{Path: "data/in.txt", Content: []byte("6 7")},
	})); err != nil {
		t.Fatalf("write: %v", err)
	}
	res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{
		Language: "python", SessionId: id,
		Code: "a, b = open('data/in.txt').read().split()\nopen('data/out.txt', 'w').write(str(int(a) * int(b)))",
	}))
	if err != nil || res.Msg.GetResult().GetExitCode() != 0 {
		t.Fatalf("run: %v %v", res, err)
	}
	list, err := c.ListFiles(t.Context(), connect.NewRequest(&edgev1.ListFilesRequest{SessionId: id, Path: "data"}))
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var names []string
	for _, f := range list.Msg.GetFiles() {
		names = append(names, f.GetPath())
	}
	if len(names) != 2 || names[0] != "data/in.txt" || names[1] != "data/out.txt" {
		t.Fatalf("listing %v, want data/in.txt and data/out.txt", names)
	}
	got, err := c.ReadFile(t.Context(), connect.NewRequest(&edgev1.ReadFileRequest{SessionId: id, Path: "data/out.txt"}))
	if err != nil || string(got.Msg.GetFile().GetContent()) != "42" {
		t.Fatalf("read: %v %v", got, err)
	}

	for _, bad := range []string{"../etc/passwd", "/etc/passwd", "data/../../x"} {
		_, err := c.ReadFile(t.Context(), connect.NewRequest(&edgev1.ReadFileRequest{SessionId: id, Path: bad}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("read %q: %v, want invalid_argument", bad, err)
		}
	}
	_, err = c.ReadFile(t.Context(), connect.NewRequest(&edgev1.ReadFileRequest{SessionId: id, Path: "missing.txt"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("read a missing file: %v, want not_found", err)
	}
	_, err = c.ListFiles(t.Context(), connect.NewRequest(&edgev1.ListFilesRequest{SessionId: "no-such-session"}))
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("list files of an unknown session: %v, want not_found", err)
	}
}

func TestMCPFileTools(t *testing.T) {
	t.Parallel()
	s := shared(t)
	endpoint := s.Edge.URL() + "/mcp"
	const sid = "mcp-files-test"
	if res := callTool(t, endpoint, "write_file", map[string]any{"session_id": sid, "path": "in/n.txt", "content": "41"}); res.IsError {
		t.Fatalf("write_file: %s", testkit.ToolText(res))
	}
	res := callTool(t, endpoint, "execute_code", map[string]any{"session_id": sid, "language": "python",
		"code": "n = int(open('in/n.txt').read())\nopen('out.txt', 'w').write(str(n + 1))"})
	if res.IsError {
		t.Fatalf("execute_code: %s", testkit.ToolText(res))
	}
	if res := callTool(t, endpoint, "read_file", map[string]any{"session_id": sid, "path": "out.txt"}); res.IsError || testkit.ToolText(res) != "42" {
		t.Fatalf("read_file: isError=%v %q", res.IsError, testkit.ToolText(res))
	}
	if res := callTool(t, endpoint, "list_files", map[string]any{"session_id": sid}); res.IsError || !strings.Contains(testkit.ToolText(res), "out.txt") {
		t.Fatalf("list_files: isError=%v %q", res.IsError, testkit.ToolText(res))
	}
	if res := callTool(t, endpoint, "read_file", map[string]any{"session_id": sid, "path": "../../etc/passwd"}); !res.IsError {
		t.Fatalf("read_file outside /workspace: %q, want isError", testkit.ToolText(res))
	}
}
