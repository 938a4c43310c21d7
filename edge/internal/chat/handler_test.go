package chat

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"buf.build/go/protovalidate"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
)

// TestHTTPErrors: POST /chat answers what it refuses as JSON with the
// status of its code, before any stream: a method other than POST, a body
// that is not the request, a door or role it does not know, no question,
// and an edge with no provider.
func TestHTTPErrors(t *testing.T) {
	t.Parallel()
	s, err := New(Config{}, nil, os.Getenv, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewHandler(s).HTTPHandler())
	t.Cleanup(srv.Close)
	for _, tc := range []struct {
		name, method, body string
		status             int
		want               string
	}{
		{"GET", http.MethodGet, "", http.StatusMethodNotAllowed, "POST a JSON body"},
		{"not JSON", http.MethodPost, "hello", http.StatusBadRequest, "read the body"},
		{"unknown field", http.MethodPost, `{"prompt": "hi"}`, http.StatusBadRequest, "unknown field"},
		{"unknown door", http.MethodPost, `{"message": "hi", "door": "side"}`, http.StatusBadRequest, `door "side"`},
		{"unknown role", http.MethodPost, `{"messages": [{"role": "system", "text": "x"}]}`, http.StatusBadRequest, `role "system"`},
		{"no question", http.MethodPost, `{}`, http.StatusBadRequest, "messages"},
		{"last is not the user's", http.MethodPost, `{"messages": [{"role": "user", "text": "a"}, {"role": "assistant", "text": "b"}]}`, http.StatusBadRequest, "the last message must be the user's"},
		{"no provider", http.MethodPost, `{"message": "hi"}`, http.StatusPreconditionFailed, "--chat-provider"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), tc.method, srv.URL, strings.NewReader(tc.body))
			res, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var body struct{ Error, Code string }
			if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != tc.status || !strings.Contains(body.Error, tc.want) {
				t.Fatalf("%d %+v, want %d with %q", res.StatusCode, body, tc.status, tc.want)
			}
		})
	}
}

// FuzzReadHTTPRequest: any body either is refused or becomes a request
// that protovalidate accepts, whose last message is the question when
// "message" is given.
func FuzzReadHTTPRequest(f *testing.F) {
	for _, seed := range []string{`{"message": "hi"}`, `{"message": "hi", "door": "direct"}`, `{"messages": [{"role": "user", "text": "a"}, {"role": "assistant", "text": "b"}], "message": "c"}`,
		`{}`, `{"door": 1}`, `{"messages": [{"role": "user", "text": ""}]}`, "\x00", `{"message": "` + strings.Repeat("x", 70000) + `"}`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest(http.MethodPost, "/chat", strings.NewReader(body))
		req, err := readHTTPRequest(r)
		if err != nil {
			return
		}
		if err := protovalidate.Validate(req); err != nil {
			t.Fatalf("accepted an invalid request: %v", err)
		}
		var in HTTPRequest
		if json.Unmarshal([]byte(body), &in) == nil && in.Message != "" {
			last := req.GetMessages()[len(req.GetMessages())-1]
			if last.GetRole() != edgev1.ChatMessage_ROLE_USER || last.GetText() != in.Message {
				t.Fatalf("last message %v, want the question", last)
			}
		}
	})
}
