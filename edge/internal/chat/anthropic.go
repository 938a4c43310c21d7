package chat

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
)

// anthropicModel speaks Anthropic's Messages.
type anthropicModel struct {
	messages anthropic.MessageService
	model    string
}

var _ Model = (*anthropicModel)(nil)

// newAnthropic returns a Model of the Messages API at baseURL; as for
// OpenAI, the SDK's environment (ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL,
// ...) is not read.
func newAnthropic(baseURL, key, model string, client *http.Client) *anthropicModel {
	c := anthropic.NewClient(option.WithoutEnvironmentDefaults(), option.WithBaseURL(baseURL), option.WithAPIKey(key),
		option.WithHTTPClient(client), option.WithMaxRetries(2))
	return &anthropicModel{messages: c.Messages, model: model}
}

func (m *anthropicModel) Turn(ctx context.Context, req TurnRequest, onText func(string)) (Turn, error) {
	params := anthropic.MessageNewParams{Model: anthropic.Model(m.model), MaxTokens: req.MaxTokens}
	if req.System != "" {
		params.System = []anthropic.TextBlockParam{{Text: req.System}}
	}
	for _, msg := range req.Messages {
		params.Messages = append(params.Messages, anthropicMessage(msg))
	}
	for _, t := range req.Tools {
		schema := anthropic.ToolInputSchemaParam{Properties: t.Schema["properties"], ExtraFields: map[string]any{}}
		for k, v := range t.Schema {
			switch k {
			case "type", "properties":
			case "required":
				for _, r := range asSlice(v) {
					if s, ok := r.(string); ok {
						schema.Required = append(schema.Required, s)
					}
				}
			default:
				schema.ExtraFields[k] = v
			}
		}
		params.Tools = append(params.Tools, anthropic.ToolUnionParam{OfTool: &anthropic.ToolParam{
			Name: t.Name, Description: anthropic.String(t.Description), InputSchema: schema,
		}})
	}
	stream := m.messages.NewStreaming(ctx, params)
	defer stream.Close()
	var msg anthropic.Message
	for stream.Next() {
		ev := stream.Current()
		if err := msg.Accumulate(ev); err != nil {
			return Turn{}, err
		}
		if ev.Type == "content_block_delta" && ev.Delta.Type == "text_delta" && ev.Delta.Text != "" {
			onText(ev.Delta.Text)
		}
	}
	if err := stream.Err(); err != nil {
		return Turn{}, err
	}
	turn := Turn{InputTokens: msg.Usage.InputTokens, OutputTokens: msg.Usage.OutputTokens}
	for _, b := range msg.Content {
		switch b.Type {
		case "text":
			turn.Text += b.Text
		case "tool_use":
			args := string(b.Input)
			if args == "" {
				args = "{}"
			}
			turn.ToolCalls = append(turn.ToolCalls, ToolCall{ID: b.ID, Name: b.Name, Arguments: args})
		}
	}
	return turn, nil
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// anthropicMessage is msg in Messages' terms: tool results are a user
// message of tool_result blocks.
func anthropicMessage(msg Message) anthropic.MessageParam {
	switch msg.Role {
	case User:
		return anthropic.NewUserMessage(anthropic.NewTextBlock(msg.Text))
	case Assistant:
		var blocks []anthropic.ContentBlockParamUnion
		if msg.Text != "" {
			blocks = append(blocks, anthropic.NewTextBlock(msg.Text))
		}
		for _, c := range msg.ToolCalls {
			var input any = json.RawMessage(c.Arguments)
			if !json.Valid([]byte(c.Arguments)) {
				input = map[string]any{}
			}
			blocks = append(blocks, anthropic.NewToolUseBlock(c.ID, input, c.Name))
		}
		return anthropic.NewAssistantMessage(blocks...)
	default:
		var blocks []anthropic.ContentBlockParamUnion
		for _, r := range msg.Results {
			blocks = append(blocks, anthropic.NewToolResultBlock(r.ID, r.Text, r.IsError))
		}
		return anthropic.NewUserMessage(blocks...)
	}
}
