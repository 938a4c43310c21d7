package chat

import (
	"context"
)

// A Model is a language model behind a provider's API: one Turn is one
// request, streamed.
type Model interface {
	// Turn asks the model to go on with msgs, offering tools, and returns
	// its answer: text, tool calls, or both. Text goes to onText as it
	// comes.
	Turn(ctx context.Context, req TurnRequest, onText func(string)) (Turn, error)
}

// TurnRequest is what one turn sends.
type TurnRequest struct {
	System   string
	Messages []Message
	Tools    []Tool
	// MaxTokens bounds the answer's tokens where the API asks for a bound
	// (Anthropic's Messages).
	MaxTokens int64
}

// Role says who wrote a Message.
type Role int

const (
	// User is the person's question.
	User Role = iota + 1
	// Assistant is the model's answer, with the tools it called.
	Assistant
	// ToolResults are the results of the assistant's last tool calls.
	ToolResults
)

// Message is one message of a conversation, as both APIs know it.
type Message struct {
	Role      Role
	Text      string
	ToolCalls []ToolCall   // of an Assistant message
	Results   []ToolResult // of a ToolResults message
}

// ToolCall is a call the model made.
type ToolCall struct {
	ID   string
	Name string
	// Arguments is a JSON object, as the model wrote it.
	Arguments string
}

// ToolResult is the answer to a ToolCall.
type ToolResult struct {
	ID      string
	Name    string
	Text    string
	IsError bool
}

// Tool is a tool offered to the model.
type Tool struct {
	Name        string
	Description string
	// Schema is the JSON Schema of its arguments, an object.
	Schema map[string]any
}

// Turn is the model's answer to one request.
type Turn struct {
	Text      string
	ToolCalls []ToolCall
	// Tokens of this request, as the provider counted them.
	InputTokens, OutputTokens int64
}
