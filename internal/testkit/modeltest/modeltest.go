// Package modeltest serves scripted language models on loopback, one per
// wire format the chat service speaks: OpenAI's chat completions and
// Anthropic's Messages, each streamed (server-sent events) as the real API
// streams, tool calls included. A Script decides each answer from the
// request, read back in terms common to both; the server records every
// request and the tokens it reported.
package modeltest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// Request is one request to the model, in terms common to both formats.
type Request struct {
	Model    string
	System   string
	Messages []Message
	// Tools are the names of the tools offered.
	Tools  []string
	Header http.Header
	// Reply is what the server answered (in Requests).
	Reply Reply
}

// Message is one message of a request.
type Message struct {
	// Role is "user", "assistant" or "tool" (OpenAI's tool messages, and
	// Anthropic's user messages of tool results).
	Role    string
	Text    string
	Calls   []Call
	Results []Result
}

// Call is a tool call, asked for in a Reply or sent back in a Message.
type Call struct {
	// ID is the call's id; empty in a Reply: the server makes one.
	ID        string
	Name      string
	Arguments string // a JSON object
}

// Result is a tool result sent to the model.
type Result struct {
	ID      string
	Text    string
	IsError bool
}

// Reply is one answer of the model.
type Reply struct {
	Text  string
	Calls []Call
	// The tokens the answer reports.
	InputTokens, OutputTokens int64
}

// A Script answers a request.
type Script func(Request) Reply

// Server is a scripted model on 127.0.0.1.
type Server struct {
	// URL is its base URL: http://127.0.0.1:PORT/v1/ for OpenAI's format,
	// http://127.0.0.1:PORT/ for Anthropic's.
	URL string

	script Script
	mu     sync.Mutex
	reqs   []Request
	in     int64
	out    int64
	calls  int
}

// Requests returns the requests so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.reqs...)
}

// Tokens returns the input and output tokens the server reported so far.
func (s *Server) Tokens() (in, out int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.in, s.out
}

// Last returns the last request's first user message and the last message,
// for scripts.
func (r Request) Last() Message {
	if len(r.Messages) == 0 {
		return Message{}
	}
	return r.Messages[len(r.Messages)-1]
}

// Question is the text of the last user message that is not tool results.
func (r Request) Question() string {
	for i := len(r.Messages) - 1; i >= 0; i-- {
		if m := r.Messages[i]; m.Role == "user" && m.Text != "" {
			return m.Text
		}
	}
	return ""
}

// HasTool says whether the request offers tool name.
func (r Request) HasTool(name string) bool {
	for _, t := range r.Tools {
		if t == name {
			return true
		}
	}
	return false
}

// answer records req and returns the script's reply with ids.
func (s *Server) answer(req Request) Reply {
	rep := s.script(req)
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() {
		req.Reply = rep
		s.reqs = append(s.reqs, req)
	}()
	s.in += rep.InputTokens
	s.out += rep.OutputTokens
	for i := range rep.Calls {
		if rep.Calls[i].ID == "" {
			s.calls++
			rep.Calls[i].ID = fmt.Sprintf("call_%d", s.calls)
		}
		if rep.Calls[i].Arguments == "" {
			rep.Calls[i].Arguments = "{}"
		}
	}
	return rep
}

func newServer(t testing.TB, script Script, path string, serve func(*Server, http.ResponseWriter, *http.Request)) *Server {
	t.Helper()
	s := &Server{script: script}
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+path, func(w http.ResponseWriter, r *http.Request) { serve(s, w, r) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// sse writes server-sent events.
type sse struct {
	w http.ResponseWriter
}

func startSSE(w http.ResponseWriter) sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return sse{w: w}
}

func (s sse) event(name string, v any) {
	var b []byte
	switch v := v.(type) {
	case string:
		b = []byte(v)
	default:
		b, _ = json.Marshal(v)
	}
	if name != "" {
		fmt.Fprintf(s.w, "event: %s\n", name)
	}
	fmt.Fprintf(s.w, "data: %s\n\n", b)
	if f, ok := s.w.(http.Flusher); ok {
		f.Flush()
	}
}

// pieces splits text in a few parts, as a stream delivers it.
func pieces(text string, n int) []string {
	if text == "" {
		return nil
	}
	var out []string
	size := max(1, (len(text)+n-1)/n)
	for len(text) > 0 {
		i := min(size, len(text))
		for i < len(text) && !utf8Start(text[i]) {
			i++
		}
		out = append(out, text[:i])
		text = text[i:]
	}
	return out
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

func badRequest(w http.ResponseWriter, msg string) {
	http.Error(w, strings.TrimSpace(msg), http.StatusBadRequest)
}
