package modeltest

import (
	"encoding/json"
	"net/http"
	"testing"
)

// NewAnthropic starts a scripted model speaking Anthropic's Messages
// (POST /v1/messages, "stream": true), closed when the test ends.
func NewAnthropic(t testing.TB, script Script) *Server {
	s := newServer(t, script, "/v1/messages", serveAnthropic)
	s.URL += "/"
	return s
}

type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
}

type anthropicRequest struct {
	Model     string          `json:"model"`
	Stream    bool            `json:"stream"`
	MaxTokens int64           `json:"max_tokens"`
	System    json.RawMessage `json:"system"`
	Messages  []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Tools []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

// blocks reads content that is a string or an array of blocks.
func blocks(raw json.RawMessage) []anthropicBlock {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []anthropicBlock{{Type: "text", Text: s}}
	}
	var bs []anthropicBlock
	_ = json.Unmarshal(raw, &bs)
	return bs
}

func serveAnthropic(s *Server, w http.ResponseWriter, r *http.Request) {
	var body anthropicRequest
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		badRequest(w, err.Error())
		return
	}
	if !body.Stream || body.MaxTokens <= 0 {
		badRequest(w, "this scripted model only streams, and max_tokens is required")
		return
	}
	req := Request{Model: body.Model, Header: r.Header.Clone()}
	for _, b := range blocks(body.System) {
		req.System += b.Text
	}
	for _, t := range body.Tools {
		req.Tools = append(req.Tools, t.Name)
	}
	for _, m := range body.Messages {
		msg := Message{Role: m.Role}
		for _, b := range blocks(m.Content) {
			switch b.Type {
			case "text":
				msg.Text += b.Text
			case "tool_use":
				msg.Calls = append(msg.Calls, Call{ID: b.ID, Name: b.Name, Arguments: string(b.Input)})
			case "tool_result":
				text := ""
				for _, c := range blocks(b.Content) {
					text += c.Text
				}
				msg.Role = "tool"
				msg.Results = append(msg.Results, Result{ID: b.ToolUseID, Text: text, IsError: b.IsError})
			}
		}
		req.Messages = append(req.Messages, msg)
	}
	rep := s.answer(req)
	out := startSSE(w)
	out.event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
		"id": "msg_scripted", "type": "message", "role": "assistant", "content": []any{}, "model": body.Model,
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]any{"input_tokens": rep.InputTokens, "output_tokens": 1}}})
	i := 0
	if rep.Text != "" {
		out.event("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{"type": "text", "text": ""}})
		for _, p := range pieces(rep.Text, 3) {
			out.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "text_delta", "text": p}})
		}
		out.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
		i++
	}
	for _, c := range rep.Calls {
		out.event("content_block_start", map[string]any{"type": "content_block_start", "index": i, "content_block": map[string]any{
			"type": "tool_use", "id": c.ID, "name": c.Name, "input": map[string]any{}}})
		for _, p := range pieces(c.Arguments, 3) {
			out.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": i, "delta": map[string]any{"type": "input_json_delta", "partial_json": p}})
		}
		out.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": i})
		i++
	}
	stop := "end_turn"
	if len(rep.Calls) > 0 {
		stop = "tool_use"
	}
	out.event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil},
		"usage": map[string]any{"output_tokens": rep.OutputTokens}})
	out.event("message_stop", map[string]any{"type": "message_stop"})
}
