package mcpserver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/testlog"
)

// TestLogsNameSessionsByHash runs an MCP session over HTTP, logging at
// debug level: its id appears nowhere in the log, its hash does.
func TestLogsNameSessionsByHash(t *testing.T) {
	t.Parallel()
	var log testlog.Buffer
	logger := slog.New(slog.NewJSONHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	withCode, _ := New(Config{Logger: logger, Open: func(context.Context, http.Header) (Backend, string, error) {
		return &scripted{steps: []step{{out: "1\n"}}}, "req-1", nil
	}}).Handlers()
	srv := httptest.NewServer(withCode)
	t.Cleanup(srv.Close)
	cs := connectHTTP(t, srv.URL)
	id := cs.ID()
	if res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"code": "print(1)"}}); err != nil || res.IsError {
		t.Fatalf("execute_code: %v %v", res, err)
	}
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	waitLogged(t, &log, "server session disconnected")
	if strings.Contains(log.String(), id) {
		t.Errorf("the session id %s is in the log:\n%s", id, log.String())
	}
	if !strings.Contains(log.String(), `"mcp_session":"`+SessionHash(id)+`"`) {
		t.Errorf("the session's hash %s is not in the log:\n%s", SessionHash(id), log.String())
	}
}

// waitLogged waits until the log says msg.
func waitLogged(t *testing.T, log *testlog.Buffer, msg string) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, func() error {
		if !strings.Contains(log.String(), msg) {
			return fmt.Errorf("the log never said %q:\n%s", msg, log.String())
		}
		return nil
	})
}

// TestHashSessionIDs checks every place a session id can be in a record:
// an attribute session_id, one bound with With, one in a group, the
// message, another string attribute, an error.
func TestHashSessionIDs(t *testing.T) {
	t.Parallel()
	id := newSessionID()
	for _, tc := range []struct {
		name string
		log  func(*slog.Logger)
		want string
	}{
		{"attribute", func(l *slog.Logger) { l.Info("connected", "session_id", id) }, `"mcp_session":"` + SessionHash(id) + `"`},
		{"with", func(l *slog.Logger) { l.With("session_id", id).Info("connected") }, `"mcp_session":"` + SessionHash(id) + `"`},
		{"group", func(l *slog.Logger) { l.WithGroup("g").Info("connected", slog.Group("s", "session_id", id)) }, `"mcp_session":"` + SessionHash(id) + `"`},
		{"message", func(l *slog.Logger) { l.Info("session " + id + " failed") }, `"msg":"session ` + SessionHash(id) + ` failed"`},
		{"string", func(l *slog.Logger) { l.Info("failed", "detail", "in "+id) }, `"detail":"in ` + SessionHash(id) + `"`},
		{"error", func(l *slog.Logger) { l.Info("failed", "error", fmt.Errorf("session %s: %w", id, io.EOF)) }, `"error":"session ` + SessionHash(id) + `: EOF"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			tc.log(slog.New(hashSessionIDs{slog.NewJSONHandler(&b, nil)}))
			if strings.Contains(b.String(), id) {
				t.Errorf("the id is in %s", b.String())
			}
			if !strings.Contains(b.String(), tc.want) {
				t.Errorf("got %s, want %s in it", b.String(), tc.want)
			}
		})
	}
}
