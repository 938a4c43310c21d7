package chat

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/internal/secretfile"
)

// TestKey reads the key from a file of the service's own (trimmed), or
// from the variable named; refuses a file others may read, an empty key,
// both sources at once, and Anthropic without a key.
func TestKey(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	own := write("own", "sk-own\n", 0o600)
	shared := write("shared", "sk-shared\n", 0o644)
	empty := write("empty", "\n", 0o600)
	getenv := func(k string) string { return map[string]string{"MY_KEY": " sk-env "}[k] }
	for _, tc := range []struct {
		name    string
		cfg     Config
		want    string
		wantErr string
	}{
		{"file", Config{Provider: ProviderOpenAI, Model: "m", KeyFile: own}, "sk-own", ""},
		{"env", Config{Provider: ProviderAnthropic, Model: "m", KeyEnv: "MY_KEY"}, "sk-env", ""},
		{"none for a local server", Config{Provider: ProviderOpenAI, Model: "m"}, "", ""},
		{"file others may read", Config{Provider: ProviderOpenAI, Model: "m", KeyFile: shared}, "", "chmod 600"},
		{"empty file", Config{Provider: ProviderOpenAI, Model: "m", KeyFile: empty}, "", "is empty"},
		{"empty variable", Config{Provider: ProviderOpenAI, Model: "m", KeyEnv: "UNSET"}, "", "UNSET is empty"},
		{"anthropic needs one", Config{Provider: ProviderAnthropic, Model: "m"}, "", "needs one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.cfg.key(getenv)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("key: %q %v, want an error with %q", got, err, tc.wantErr)
				}
				if tc.name == "file others may read" && !errors.Is(err, secretfile.ErrExposed) {
					t.Errorf("%v does not wrap ErrExposed", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("key: %q %v, want %q", got, err, tc.want)
			}
		})
	}
}

// TestValidate refuses what cannot be used.
func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, ""},
		{Config{Provider: ProviderOpenAI, Model: "m"}, ""},
		{Config{Provider: "gemini", Model: "m"}, `chat provider "gemini"`},
		{Config{Provider: ProviderOpenAI}, "model is empty"},
		{Config{Provider: ProviderOpenAI, Model: "m", KeyFile: "f", KeyEnv: "E"}, "not both"},
		{Config{Provider: ProviderOpenAI, Model: "m", Limits: Limits{MaxTurns: -1}}, "negative"},
	} {
		err := tc.cfg.Validate()
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// TestNoProvider: with no provider, a chat fails with failed_precondition
// saying how to configure one, before it touches the tools.
func TestNoProvider(t *testing.T) {
	t.Parallel()
	s, err := New(Config{}, nil, os.Getenv, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Chat(t.Context(), nil, &edgev1.ChatRequest{Messages: []*edgev1.ChatMessage{{Role: edgev1.ChatMessage_ROLE_USER, Text: "hi"}}},
		func(*edgev1.ChatResponse) error { return nil })
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "--chat-provider") ||
		!strings.Contains(err.Error(), "--chat-base-url") {
		t.Fatalf("chat with no provider: %v", err)
	}
}
