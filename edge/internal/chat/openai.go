package chat

import (
	"context"
	"fmt"
	"net/http"
	"slices"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"
)

// openAIModel speaks OpenAI's chat completions, which OpenAI and the
// servers people run locally (Ollama, vLLM, llama.cpp, LM Studio) serve.
type openAIModel struct {
	chat  openai.ChatCompletionService
	model string
}

var _ Model = (*openAIModel)(nil)

// newOpenAI returns a Model of the chat completions at baseURL. Only the
// options given here apply: the SDK's environment (OPENAI_API_KEY,
// OPENAI_BASE_URL, ...) is not read, so the edge's configuration alone
// says where requests go and with which key.
func newOpenAI(baseURL, key, model string, client *http.Client) *openAIModel {
	opts := []option.RequestOption{option.WithBaseURL(baseURL), option.WithHTTPClient(client), option.WithMaxRetries(2)}
	if key != "" {
		opts = append(opts, option.WithAPIKey(key))
	}
	return &openAIModel{chat: openai.NewChatCompletionService(opts...), model: model}
}

func (m *openAIModel) Turn(ctx context.Context, req TurnRequest, onText func(string)) (Turn, error) {
	params := openai.ChatCompletionNewParams{
		Model:         shared.ChatModel(m.model),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	if req.System != "" {
		params.Messages = append(params.Messages, openai.SystemMessage(req.System))
	}
	for _, msg := range req.Messages {
		params.Messages = append(params.Messages, openAIMessages(msg)...)
	}
	for _, t := range req.Tools {
		params.Tools = append(params.Tools, openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
			Name: t.Name, Description: openai.String(t.Description), Parameters: shared.FunctionParameters(t.Schema),
		}))
	}
	stream := m.chat.NewStreaming(ctx, params)
	defer stream.Close()
	var turn Turn
	var calls []ToolCall // by the index the API gives each
	for stream.Next() {
		chunk := stream.Current()
		if chunk.JSON.Usage.Valid() {
			turn.InputTokens, turn.OutputTokens = chunk.Usage.PromptTokens, chunk.Usage.CompletionTokens
		}
		for _, c := range chunk.Choices {
			if c.Index != 0 {
				continue
			}
			if t := c.Delta.Content; t != "" {
				turn.Text += t
				onText(t)
			}
			for _, d := range c.Delta.ToolCalls {
				i := int(d.Index)
				if i < 0 || i > 127 {
					return Turn{}, fmt.Errorf("tool call index %d out of range", i)
				}
				if i >= len(calls) {
					calls = slices.Grow(calls, i+1-len(calls))[:i+1]
				}
				if d.ID != "" {
					calls[i].ID = d.ID
				}
				calls[i].Name += d.Function.Name
				calls[i].Arguments += d.Function.Arguments
			}
		}
	}
	if err := stream.Err(); err != nil {
		return Turn{}, err
	}
	for i, c := range calls {
		if c.Name == "" {
			continue
		}
		if c.ID == "" {
			c.ID = fmt.Sprintf("call_%d", i)
		}
		turn.ToolCalls = append(turn.ToolCalls, c)
	}
	return turn, nil
}

// openAIMessages is msg in chat completions' terms: tool results are one
// message each.
func openAIMessages(msg Message) []openai.ChatCompletionMessageParamUnion {
	switch msg.Role {
	case User:
		return []openai.ChatCompletionMessageParamUnion{openai.UserMessage(msg.Text)}
	case Assistant:
		p := openai.ChatCompletionAssistantMessageParam{}
		if msg.Text != "" {
			p.Content.OfString = openai.String(msg.Text)
		}
		for _, c := range msg.ToolCalls {
			p.ToolCalls = append(p.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
				ID: c.ID, Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.Name, Arguments: c.Arguments},
			}})
		}
		return []openai.ChatCompletionMessageParamUnion{{OfAssistant: &p}}
	default:
		var out []openai.ChatCompletionMessageParamUnion
		for _, r := range msg.Results {
			text := r.Text
			if r.IsError {
				text = "Error: " + text
			}
			out = append(out, openai.ToolMessage(text, r.ID))
		}
		return out
	}
}
