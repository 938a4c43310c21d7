package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/edge/internal/mcpserver"
	"github.com/codemode-go/codemode/edge/internal/ratelimit"
	"github.com/codemode-go/codemode/edge/internal/tenant"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/telemetry"
)

// systemPrompt tells the model what it is for; the tools' descriptions
// say the rest.
const systemPrompt = "You answer questions with the tools you are given. " +
	"When a question needs computing, data or an API, call a tool rather than guess, then answer from what it returned. " +
	"Keep the final answer short and give the figures the tools computed."

// Service runs conversations.
type Service struct {
	cfg     Config
	limits  Limits
	model   Model
	key     string // to keep out of what the caller reads
	servers *mcpserver.Servers
	logger  *slog.Logger
	// conversations counts each tenant's conversations under way.
	conversations *ratelimit.Limiter
}

// New returns the chat Service of cfg over servers (the edge's MCP
// servers), reading the key with getenv when cfg names a variable. With no
// provider configured it returns a Service whose every conversation fails
// with failed_precondition.
func New(cfg Config, servers *mcpserver.Servers, getenv func(string) string, logger *slog.Logger) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Service{cfg: cfg, limits: cfg.Limits.withDefaults(), servers: servers, logger: logger}
	s.conversations = ratelimit.New(ratelimit.Config{Concurrency: s.limits.TenantConversations})
	if !cfg.Enabled() {
		return s, nil
	}
	key, err := cfg.key(getenv)
	if err != nil {
		return nil, err
	}
	s.key = key
	client := providerClient()
	switch cfg.Provider {
	case ProviderAnthropic:
		s.model = newAnthropic(cfg.baseURL(), key, cfg.Model, client)
	default:
		s.model = newOpenAI(cfg.baseURL(), key, cfg.Model, client)
	}
	return s, nil
}

// providerClient is the HTTP client of the provider's API: HTTP/1.1, or
// HTTP/2 over TLS, as the SDKs expect (server.NewClient speaks h2c to
// plain-HTTP addresses, which a local Ollama does not). No overall
// timeout: answers stream; the conversation's deadline bounds them.
func providerClient() *http.Client {
	return &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
}

// errNoProvider is the answer of a chat on an edge with no provider.
var errNoProvider = connect.NewError(connect.CodeFailedPrecondition, errors.New(
	"no chat provider is configured on this edge: start it with --chat-provider openai|anthropic (CODEMODE_CHAT_PROVIDER), "+
		"--chat-model (CODEMODE_CHAT_MODEL), the key in --chat-key-file or --chat-key-env, and for a local server such as Ollama "+
		"--chat-base-url http://127.0.0.1:11434/v1/"))

// Chat runs the conversation of req for the caller whose request carries
// header h, sending every event to send, a Done last. A bound that stops
// the conversation, or a provider that fails, is a Done with its reason,
// not an error; an error is the caller's cancellation, a failure of send,
// or the tools not being reachable.
func (s *Service) Chat(ctx context.Context, h http.Header, req *edgev1.ChatRequest, send func(*edgev1.ChatResponse) error) error {
	msgs, err := conversation(req)
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	if s.model == nil {
		return errNoProvider
	}
	// The edge's authentication put the tenant in ctx (the door needs a
	// key); without keys every caller is the one tenant.
	who, _ := tenant.FromContext(ctx)
	release, err := s.conversations.Acquire(who)
	if err != nil {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
			"this tenant has %d conversations under way, the most it may have at once (--chat-tenant-conversations): retry when one has ended", s.limits.TenantConversations))
	}
	defer release()
	c := &conv{s: s, send: send, start: time.Now(), requestID: h.Get(server.RequestIDHeader)}
	outer := ctx
	ctx, cancel := context.WithTimeout(ctx, s.limits.MaxDuration)
	defer cancel()
	// Each tool call gets a request id of its own, as over MCP.
	h = h.Clone()
	h.Del(server.RequestIDHeader)
	cs, err := s.servers.Connect(ctx, h, req.GetDoor() != edgev1.Door_DOOR_DIRECT, c.progress)
	if err != nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	defer cs.Close()
	tools, err := listTools(ctx, cs)
	if err != nil {
		return err
	}
	done, err := c.run(outer, ctx, cs, msgs, tools)
	// One line per conversation, however it ended: a cancelled one too.
	reason := done.GetReason().String()
	if err != nil {
		reason = "canceled"
		if outer.Err() == nil {
			reason = "error"
		}
	}
	// The span of the request (the Connect handler's or POST /chat's):
	// what the conversation did, never what was said.
	trace.SpanFromContext(outer).SetAttributes(telemetry.AttrRequestID.String(c.requestID),
		attribute.String("gen_ai.provider.name", s.cfg.Provider), attribute.String("gen_ai.request.model", s.cfg.Model),
		attribute.String("codemode.chat.door", req.GetDoor().String()), attribute.String("codemode.chat.reason", reason),
		attribute.Int("codemode.chat.turns", c.turns), attribute.Int("codemode.chat.tool_calls", c.calls),
		attribute.Int64("gen_ai.usage.input_tokens", c.in), attribute.Int64("gen_ai.usage.output_tokens", c.out))
	s.logger.InfoContext(outer, "chat", "request_id", c.requestID, "door", req.GetDoor().String(), "reason", reason,
		"turns", c.turns, "tool_calls", c.calls, "input_tokens", c.in, "output_tokens", c.out, "duration", time.Since(c.start))
	if err != nil {
		return err
	}
	return c.emit(&edgev1.ChatResponse{Event: &edgev1.ChatResponse_Done{Done: done}})
}

// conversation is req's messages; the last must be the user's.
func conversation(req *edgev1.ChatRequest) ([]Message, error) {
	var msgs []Message
	for _, m := range req.GetMessages() {
		role := User
		if m.GetRole() == edgev1.ChatMessage_ROLE_ASSISTANT {
			role = Assistant
		}
		msgs = append(msgs, Message{Role: role, Text: m.GetText()})
	}
	if len(msgs) == 0 || msgs[len(msgs)-1].Role != User {
		return nil, errors.New("the last message must be the user's")
	}
	return msgs, nil
}

// listTools lists the session's tools for the model.
func listTools(ctx context.Context, cs *mcp.ClientSession) ([]Tool, error) {
	var tools []Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, connect.NewError(connect.CodeUnavailable, fmt.Errorf("list tools: %w", err))
		}
		var schema map[string]any
		b, err := json.Marshal(t.InputSchema)
		if err == nil {
			err = json.Unmarshal(b, &schema)
		}
		if err != nil || schema == nil {
			schema = map[string]any{"type": "object"}
		}
		delete(schema, "$schema")
		tools = append(tools, Tool{Name: t.Name, Description: t.Description, Schema: schema})
	}
	return tools, nil
}

// conv is one conversation under way.
type conv struct {
	s         *Service
	start     time.Time
	requestID string

	mu   sync.Mutex // send is called from the loop and the progress handler
	send func(*edgev1.ChatResponse) error
	sent error // the first failure of send

	turns, calls int
	in, out      int64
}

// emit sends ev, with the key taken out of any text.
func (c *conv) emit(ev *edgev1.ChatResponse) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sent != nil {
		return c.sent
	}
	c.sent = c.send(ev)
	return c.sent
}

// failed is the first failure of send.
func (c *conv) failed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent
}

// progress passes execute_code's output on; the token is the tool call's
// id.
func (c *conv) progress(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
	id, _ := req.Params.ProgressToken.(string)
	if id == "" || strings.HasPrefix(req.Params.Message, "[running for ") {
		return
	}
	_ = c.emit(&edgev1.ChatResponse{Event: &edgev1.ChatResponse_ToolOutput{ToolOutput: &edgev1.ToolOutput{Id: id, Text: req.Params.Message}}})
}

// run is the loop: ask the model, call the tools it asks for, give it the
// results, until it answers without a tool call or a bound stops it.
func (c *conv) run(outer, ctx context.Context, cs *mcp.ClientSession, msgs []Message, tools []Tool) (*edgev1.Done, error) {
	lim := c.s.limits
	var answer string
	done := func(reason edgev1.Done_Reason, msg string) *edgev1.Done {
		return &edgev1.Done{Reason: reason, Message: c.s.redact(msg), Answer: answer, Turns: uint32(c.turns), ToolCalls: uint32(c.calls),
			InputTokens: uint64(c.in), OutputTokens: uint64(c.out), Duration: durationpb.New(time.Since(c.start)),
			Provider: c.s.cfg.Provider, Model: c.s.cfg.Model}
	}
	for {
		if c.turns >= lim.MaxTurns {
			return done(edgev1.Done_REASON_MAX_TURNS, fmt.Sprintf("stopped after %d turns, the most a conversation may take (--chat-max-turns): the model was still calling tools", c.turns)), nil
		}
		if c.in+c.out >= lim.MaxTokens {
			return done(edgev1.Done_REASON_MAX_TOKENS, fmt.Sprintf("stopped after %d tokens, over the %d a conversation may use (--chat-max-tokens)", c.in+c.out, lim.MaxTokens)), nil
		}
		c.turns++
		turn, err := c.s.model.Turn(ctx, TurnRequest{System: systemPrompt, Messages: msgs, Tools: tools, MaxTokens: lim.TurnTokens}, func(t string) {
			_ = c.emit(&edgev1.ChatResponse{Event: &edgev1.ChatResponse_Text{Text: t}})
		})
		if err != nil {
			if stop := c.stopped(outer, ctx); stop != nil {
				return done(edgev1.Done_REASON_MAX_DURATION, stop.Error()), nil
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			c.s.logger.WarnContext(ctx, "chat provider failed", "request_id", c.requestID, "error", c.s.redact(err.Error()))
			return done(edgev1.Done_REASON_PROVIDER_ERROR, "the model's provider failed: "+err.Error()), nil
		}
		if err := c.failed(); err != nil {
			return nil, err
		}
		c.in += turn.InputTokens
		c.out += turn.OutputTokens
		if err := c.emit(&edgev1.ChatResponse{Event: &edgev1.ChatResponse_Usage{Usage: &edgev1.Usage{
			Turn: uint32(c.turns), InputTokens: uint64(turn.InputTokens), OutputTokens: uint64(turn.OutputTokens)}}}); err != nil {
			return nil, err
		}
		answer = turn.Text
		msgs = append(msgs, Message{Role: Assistant, Text: turn.Text, ToolCalls: turn.ToolCalls})
		if len(turn.ToolCalls) == 0 {
			return done(edgev1.Done_REASON_ANSWERED, "answered"), nil
		}
		results := Message{Role: ToolResults}
		for _, call := range turn.ToolCalls {
			if c.calls >= lim.MaxToolCalls {
				return done(edgev1.Done_REASON_MAX_TOOL_CALLS, fmt.Sprintf("stopped at %d tool calls, the most a conversation may make (--chat-max-tool-calls)", c.calls)), nil
			}
			c.calls++
			res, err := c.callTool(ctx, cs, call)
			if err != nil {
				if stop := c.stopped(outer, ctx); stop != nil {
					return done(edgev1.Done_REASON_MAX_DURATION, stop.Error()), nil
				}
				return nil, err
			}
			results.Results = append(results.Results, res)
		}
		msgs = append(msgs, results)
	}
}

// stopped returns why the conversation's own deadline ended it, or nil
// when it did not (the caller's context may have ended instead).
func (c *conv) stopped(outer, ctx context.Context) error {
	if outer.Err() == nil && ctx.Err() != nil {
		return fmt.Errorf("stopped after %s, the longest a conversation may take (--chat-max-duration)", c.s.limits.MaxDuration)
	}
	return nil
}

// callTool calls one tool through the MCP session and streams the call and
// its result. A tool's failure is a result with is_error for the model.
func (c *conv) callTool(ctx context.Context, cs *mcp.ClientSession, call ToolCall) (ToolResult, error) {
	if err := c.emit(&edgev1.ChatResponse{Event: &edgev1.ChatResponse_ToolCall{ToolCall: &edgev1.ToolCall{Id: call.ID, Name: call.Name, Arguments: call.Arguments}}}); err != nil {
		return ToolResult{}, err
	}
	out := ToolResult{ID: call.ID, Name: call.Name}
	var args map[string]any
	if err := json.Unmarshal([]byte(cmpOr(call.Arguments, "{}")), &args); err != nil {
		out.Text, out.IsError = fmt.Sprintf("the arguments are not a JSON object: %v", err), true
		return out, c.emitResult(out, nil)
	}
	params := &mcp.CallToolParams{Name: call.Name, Arguments: args}
	params.SetProgressToken(call.ID)
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		if ctx.Err() != nil {
			return ToolResult{}, ctx.Err()
		}
		// An unknown tool, or arguments its schema refuses: the model
		// reads why and may try again.
		out.Text, out.IsError = err.Error(), true
		return out, c.emitResult(out, nil)
	}
	out.IsError = res.IsError
	var texts []string
	for _, ct := range res.Content {
		if t, ok := ct.(*mcp.TextContent); ok {
			texts = append(texts, t.Text)
		}
	}
	out.Text = strings.Join(texts, "\n")
	return out, c.emitResult(out, res)
}

// emitResult streams a tool result, with its structured content and its
// artifacts (content items after the text, in the order of the structured
// result's artifacts).
func (c *conv) emitResult(r ToolResult, res *mcp.CallToolResult) error {
	ev := &edgev1.ToolResult{Id: r.ID, Name: r.Name, Text: c.s.redact(r.Text), IsError: r.IsError}
	if res != nil {
		if res.StructuredContent != nil {
			if b, err := json.Marshal(res.StructuredContent); err == nil {
				ev.Structured = c.s.redact(string(b))
			}
		}
		var names []string
		if m, ok := res.StructuredContent.(map[string]any); ok {
			for _, a := range asSlice(m["artifacts"]) {
				if am, ok := a.(map[string]any); ok {
					n, _ := am["name"].(string)
					names = append(names, n)
				}
			}
		}
		i := 0
		for _, ct := range res.Content {
			var a *edgev1.ChatArtifact
			switch v := ct.(type) {
			case *mcp.ImageContent:
				a = &edgev1.ChatArtifact{MediaType: v.MIMEType, Content: v.Data}
			case *mcp.EmbeddedResource:
				if v.Resource == nil {
					continue
				}
				data := v.Resource.Blob
				if data == nil {
					data = []byte(v.Resource.Text)
				}
				a = &edgev1.ChatArtifact{MediaType: v.Resource.MIMEType, Content: data}
			default:
				continue
			}
			if i < len(names) {
				a.Name = names[i]
			}
			i++
			ev.Artifacts = append(ev.Artifacts, a)
		}
	}
	return c.emit(&edgev1.ChatResponse{Event: &edgev1.ChatResponse_ToolResult{ToolResult: ev}})
}

// redact takes the provider's key out of s: no text the caller reads holds
// it, whatever a provider's error quotes.
func (s *Service) redact(text string) string {
	if s.key == "" {
		return text
	}
	return strings.ReplaceAll(text, s.key, "[REDACTED]")
}

func cmpOr(s, def string) string {
	if strings.TrimSpace(s) == "" {
		return def
	}
	return s
}
