// Package chat puts a language model in front of codemode's own MCP tools:
// a tool-calling loop whose every tool call goes through an in-memory MCP
// session on the edge's own MCP server (mcpserver.Servers.Connect), so it
// has the tools, tenant, limits, policies and results of /mcp (door code)
// or /mcp-no-code-execute (door direct), with no second copy of any.
//
// The providers are OpenAI's chat completions (OpenAI, and the servers run
// locally: Ollama, vLLM, llama.cpp, LM Studio) and Anthropic's Messages,
// through their official SDKs, streamed. A conversation is bounded in
// turns, tool calls, tokens and wall time.
package chat

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/secretfile"
)

// Providers.
const (
	ProviderOpenAI    = "openai"
	ProviderAnthropic = "anthropic"
)

// Defaults.
const (
	DefaultMaxTurns     = 12
	DefaultMaxToolCalls = 24
	DefaultMaxTokens    = 200_000
	DefaultMaxDuration  = 5 * time.Minute
	DefaultTurnTokens   = 4096
	// DefaultTenantConversations bounds one tenant's conversations at once.
	DefaultTenantConversations = 4
)

// Config configures the chat service.
type Config struct {
	// Provider is ProviderOpenAI or ProviderAnthropic; empty: no chat (the
	// RPC answers failed_precondition saying how to configure one).
	Provider string
	// BaseURL is the API's; empty: the provider's own.
	BaseURL string
	// Model is the model's name, as the provider knows it.
	Model string
	// KeyFile holds the API key; KeyEnv names an environment variable that
	// does. At most one; neither: no key (a local server may need none).
	KeyFile, KeyEnv string
	// Limits bound each conversation.
	Limits Limits
}

// Limits bound one conversation. Zero fields take the defaults.
type Limits struct {
	// MaxTurns bounds the requests to the model.
	MaxTurns int
	// MaxToolCalls bounds the tool calls.
	MaxToolCalls int
	// MaxTokens bounds the input and output tokens summed over the turns;
	// the turn that goes over is the last.
	MaxTokens int64
	// MaxDuration bounds the wall time.
	MaxDuration time.Duration
	// TurnTokens bounds one answer's tokens, where the API asks for a
	// bound (Anthropic's max_tokens).
	TurnTokens int64
	// TenantConversations bounds the conversations of one tenant under
	// way at once; more are refused with resource_exhausted.
	TenantConversations int
}

func (l Limits) withDefaults() Limits {
	if l.MaxTurns <= 0 {
		l.MaxTurns = DefaultMaxTurns
	}
	if l.MaxToolCalls <= 0 {
		l.MaxToolCalls = DefaultMaxToolCalls
	}
	if l.MaxTokens <= 0 {
		l.MaxTokens = DefaultMaxTokens
	}
	if l.MaxDuration <= 0 {
		l.MaxDuration = DefaultMaxDuration
	}
	if l.TurnTokens <= 0 {
		l.TurnTokens = DefaultTurnTokens
	}
	if l.TenantConversations <= 0 {
		l.TenantConversations = DefaultTenantConversations
	}
	return l
}

// Enabled says whether a provider is configured.
func (c Config) Enabled() bool { return c.Provider != "" }

// Validate reports whether the configuration can be used.
func (c Config) Validate() error {
	var errs []error
	switch c.Provider {
	case "":
		return nil
	case ProviderOpenAI, ProviderAnthropic:
	default:
		errs = append(errs, fmt.Errorf("chat provider %q: want %s or %s", c.Provider, ProviderOpenAI, ProviderAnthropic))
	}
	if c.Model == "" {
		errs = append(errs, errors.New("chat model is empty"))
	}
	if c.KeyFile != "" && c.KeyEnv != "" {
		errs = append(errs, errors.New("chat key: give a file or an environment variable, not both"))
	}
	if c.Limits.MaxTurns < 0 || c.Limits.MaxToolCalls < 0 || c.Limits.MaxTokens < 0 || c.Limits.MaxDuration < 0 || c.Limits.TurnTokens < 0 || c.Limits.TenantConversations < 0 {
		errs = append(errs, errors.New("chat limits must not be negative"))
	}
	return errors.Join(errs...)
}

// baseURL is the API's base URL.
func (c Config) baseURL() string {
	if c.BaseURL != "" {
		return c.BaseURL
	}
	if c.Provider == ProviderAnthropic {
		return "https://api.anthropic.com/"
	}
	return "https://api.openai.com/v1/"
}

// key reads the API key from the file or the environment variable.
func (c Config) key(getenv func(string) string) (string, error) {
	switch {
	case c.KeyFile != "":
		b, err := secretfile.Read(c.KeyFile)
		if err != nil {
			return "", fmt.Errorf("read chat key: %w", err)
		}
		k := strings.TrimSpace(string(b))
		if k == "" {
			return "", fmt.Errorf("chat key file %s is empty", c.KeyFile)
		}
		return k, nil
	case c.KeyEnv != "":
		k := strings.TrimSpace(getenv(c.KeyEnv))
		if k == "" {
			return "", fmt.Errorf("chat key: the environment variable %s is empty", c.KeyEnv)
		}
		return k, nil
	}
	if c.Provider == ProviderAnthropic {
		return "", errors.New("chat key: Anthropic's API needs one (--chat-key-file or --chat-key-env)")
	}
	return "", nil
}

// Flags declares the chat's flags on fs, each with its environment
// variable, and returns what reads them into a Config once parsed.
func Flags(fs *cli.Flags) func() Config {
	provider := fs.String("chat-provider", "", "model provider of the chat service (POST /chat, ChatService): "+ProviderOpenAI+" (OpenAI's chat completions, also Ollama, vLLM, llama.cpp, LM Studio) or "+ProviderAnthropic+"; empty: no chat")
	fs.Env("chat-provider", "CODEMODE_CHAT_PROVIDER")
	baseURL := fs.String("chat-base-url", "", "base URL of the provider's API, e.g. http://127.0.0.1:11434/v1/ for a local Ollama; empty: the provider's own")
	fs.Env("chat-base-url", "CODEMODE_CHAT_BASE_URL")
	model := fs.String("chat-model", "", "model name, as the provider knows it")
	fs.Env("chat-model", "CODEMODE_CHAT_MODEL")
	keyFile := fs.String("chat-key-file", "", "file holding the provider's API key, mode 0600 or 0400 (one its group or others may read or write is refused)")
	fs.Env("chat-key-file", "CODEMODE_CHAT_KEY_FILE")
	keyEnv := fs.String("chat-key-env", "", "name of an environment variable holding the provider's API key (e.g. OPENAI_API_KEY), instead of a file")
	fs.Env("chat-key-env", "CODEMODE_CHAT_KEY_ENV")
	turns := fs.Int("chat-max-turns", DefaultMaxTurns, "requests to the model in one conversation")
	fs.Env("chat-max-turns", "CODEMODE_CHAT_MAX_TURNS")
	calls := fs.Int("chat-max-tool-calls", DefaultMaxToolCalls, "tool calls in one conversation")
	fs.Env("chat-max-tool-calls", "CODEMODE_CHAT_MAX_TOOL_CALLS")
	tokens := fs.Int64("chat-max-tokens", DefaultMaxTokens, "input and output tokens of one conversation, summed over its turns")
	fs.Env("chat-max-tokens", "CODEMODE_CHAT_MAX_TOKENS")
	duration := fs.Duration("chat-max-duration", DefaultMaxDuration, "wall time of one conversation")
	fs.Env("chat-max-duration", "CODEMODE_CHAT_MAX_DURATION")
	turnTokens := fs.Int64("chat-turn-tokens", DefaultTurnTokens, "output tokens of one answer, where the API asks for a bound (Anthropic's max_tokens)")
	fs.Env("chat-turn-tokens", "CODEMODE_CHAT_TURN_TOKENS")
	conversations := fs.Int("chat-tenant-conversations", DefaultTenantConversations, "conversations of one tenant under way at once; more are refused with resource_exhausted")
	fs.Env("chat-tenant-conversations", "CODEMODE_CHAT_TENANT_CONVERSATIONS")
	return func() Config {
		return Config{Provider: strings.ToLower(strings.TrimSpace(*provider)), BaseURL: *baseURL, Model: *model, KeyFile: *keyFile, KeyEnv: *keyEnv,
			Limits: Limits{MaxTurns: *turns, MaxToolCalls: *calls, MaxTokens: *tokens, MaxDuration: *duration, TurnTokens: *turnTokens,
				TenantConversations: *conversations}}
	}
}
