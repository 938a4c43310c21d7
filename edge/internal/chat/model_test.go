package chat

import (
	"strings"
	"testing"

	"github.com/codemode-go/codemode/internal/testkit/modeltest"
)

// TestModels runs two turns of each provider's adapter against a scripted
// model of its wire format: a tool call streamed in pieces, then text
// answering from the tool's result. The key goes in the provider's header,
// the history goes back as the API wants it, and the tokens are the
// server's.
func TestModels(t *testing.T) {
	t.Parallel()
	const key = "sk-test-0123456789"
	script := func(r modeltest.Request) modeltest.Reply {
		if last := r.Last(); last.Role == "tool" {
			return modeltest.Reply{Text: "The answer is " + last.Results[0].Text + ".", InputTokens: 120, OutputTokens: 7}
		}
		return modeltest.Reply{Text: "Let me compute.", Calls: []modeltest.Call{{Name: "execute_code", Arguments: `{"code":"print(6*7)","language":"python"}`}},
			InputTokens: 100, OutputTokens: 20}
	}
	for _, tc := range []struct {
		name   string
		start  func(testing.TB, modeltest.Script) *modeltest.Server
		model  func(url string) Model
		header func(r modeltest.Request) string
	}{
		{"openai", modeltest.NewOpenAI, func(url string) Model { return newOpenAI(url, key, "gpt-test", providerClient()) },
			func(r modeltest.Request) string { return r.Header.Get("Authorization") }},
		{"anthropic", modeltest.NewAnthropic, func(url string) Model { return newAnthropic(url, key, "claude-test", providerClient()) },
			func(r modeltest.Request) string { return r.Header.Get("X-Api-Key") + r.Header.Get("Authorization") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := tc.start(t, script)
			m := tc.model(srv.URL)
			tools := []Tool{{Name: "execute_code", Description: "run code", Schema: map[string]any{"type": "object",
				"properties": map[string]any{"code": map[string]any{"type": "string"}}, "required": []any{"code"}}}}
			msgs := []Message{{Role: User, Text: "What is six times seven?"}}
			var streamed strings.Builder
			turn, err := m.Turn(t.Context(), TurnRequest{System: "be brief", Messages: msgs, Tools: tools, MaxTokens: 100}, func(s string) { streamed.WriteString(s) })
			if err != nil {
				t.Fatal(err)
			}
			if turn.Text != "Let me compute." || streamed.String() != turn.Text || len(turn.ToolCalls) != 1 ||
				turn.ToolCalls[0].Name != "execute_code" || turn.ToolCalls[0].Arguments != `{"code":"print(6*7)","language":"python"}` ||
				turn.InputTokens != 100 || turn.OutputTokens != 20 {
				t.Fatalf("first turn %+v, streamed %q", turn, streamed.String())
			}
			msgs = append(msgs, Message{Role: Assistant, Text: turn.Text, ToolCalls: turn.ToolCalls},
				Message{Role: ToolResults, Results: []ToolResult{{ID: turn.ToolCalls[0].ID, Name: "execute_code", Text: "42"}}})
			turn, err = m.Turn(t.Context(), TurnRequest{System: "be brief", Messages: msgs, Tools: tools, MaxTokens: 100}, func(string) {})
			if err != nil {
				t.Fatal(err)
			}
			if turn.Text != "The answer is 42." || len(turn.ToolCalls) != 0 || turn.InputTokens != 120 || turn.OutputTokens != 7 {
				t.Fatalf("second turn %+v", turn)
			}
			reqs := srv.Requests()
			if len(reqs) != 2 {
				t.Fatalf("%d requests", len(reqs))
			}
			r := reqs[1]
			if got := tc.header(r); !strings.Contains(got, key) {
				t.Errorf("key header %q", got)
			}
			if r.System != "be brief" || len(r.Tools) != 1 || len(r.Messages) != 3 || r.Messages[1].Calls[0].ID != "call_1" ||
				r.Messages[2].Results[0].Text != "42" || r.Messages[2].Results[0].ID != r.Messages[1].Calls[0].ID {
				t.Errorf("second request %+v", r)
			}
		})
	}
}
