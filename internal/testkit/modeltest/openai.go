package modeltest

import (
	"encoding/json"
	"net/http"
	"testing"
)

// NewOpenAI starts a scripted model speaking OpenAI's chat completions
// (POST /v1/chat/completions, "stream": true), closed when the test ends.
func NewOpenAI(t testing.TB, script Script) *Server {
	s := newServer(t, script, "/v1/chat/completions", serveOpenAI)
	s.URL += "/v1/"
	return s
}

type openAIRequest struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"messages"`
	Tools []struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// contentText reads content that is a string or an array of text parts.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type, Text string
	}
	_ = json.Unmarshal(raw, &parts)
	for _, p := range parts {
		s += p.Text
	}
	return s
}

func serveOpenAI(s *Server, w http.ResponseWriter, r *http.Request) {
	var body openAIRequest
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		badRequest(w, err.Error())
		return
	}
	if !body.Stream {
		badRequest(w, "this scripted model only streams")
		return
	}
	req := Request{Model: body.Model, Header: r.Header.Clone()}
	for _, t := range body.Tools {
		req.Tools = append(req.Tools, t.Function.Name)
	}
	for _, m := range body.Messages {
		text := contentText(m.Content)
		switch m.Role {
		case "system", "developer":
			req.System += text
		case "tool":
			// Consecutive tool messages are one message of results.
			if n := len(req.Messages); n > 0 && req.Messages[n-1].Role == "tool" {
				req.Messages[n-1].Results = append(req.Messages[n-1].Results, Result{ID: m.ToolCallID, Text: text})
				continue
			}
			req.Messages = append(req.Messages, Message{Role: "tool", Results: []Result{{ID: m.ToolCallID, Text: text}}})
		default:
			msg := Message{Role: m.Role, Text: text}
			for _, c := range m.ToolCalls {
				msg.Calls = append(msg.Calls, Call{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
			}
			req.Messages = append(req.Messages, msg)
		}
	}
	rep := s.answer(req)
	out := startSSE(w)
	chunk := func(delta map[string]any, finish any) map[string]any {
		return map[string]any{"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 1700000000, "model": body.Model,
			"choices": []map[string]any{{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": nil}}}
	}
	out.event("", chunk(map[string]any{"role": "assistant", "content": ""}, nil))
	for _, p := range pieces(rep.Text, 3) {
		out.event("", chunk(map[string]any{"content": p}, nil))
	}
	for i, c := range rep.Calls {
		out.event("", chunk(map[string]any{"tool_calls": []map[string]any{{"index": i, "id": c.ID, "type": "function",
			"function": map[string]any{"name": c.Name, "arguments": ""}}}}, nil))
		for _, p := range pieces(c.Arguments, 3) {
			out.event("", chunk(map[string]any{"tool_calls": []map[string]any{{"index": i, "function": map[string]any{"arguments": p}}}}, nil))
		}
	}
	finish := "stop"
	if len(rep.Calls) > 0 {
		finish = "tool_calls"
	}
	out.event("", chunk(map[string]any{}, finish))
	if body.StreamOptions.IncludeUsage {
		out.event("", map[string]any{"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 1700000000, "model": body.Model,
			"choices": []any{}, "usage": map[string]any{"prompt_tokens": rep.InputTokens, "completion_tokens": rep.OutputTokens,
				"total_tokens": rep.InputTokens + rep.OutputTokens}})
	}
	out.event("", "[DONE]")
}
