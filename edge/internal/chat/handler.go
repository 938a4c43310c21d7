package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"buf.build/go/protovalidate"
	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
)

// Handler implements ChatService over a Service.
type Handler struct{ s *Service }

var _ edgev1connect.ChatServiceHandler = Handler{}

// NewHandler returns the ChatService of s.
func NewHandler(s *Service) Handler { return Handler{s: s} }

// Chat implements ChatService.
func (h Handler) Chat(ctx context.Context, req *connect.Request[edgev1.ChatRequest], stream *connect.ServerStream[edgev1.ChatResponse]) error {
	return h.s.Chat(ctx, req.Header(), req.Msg, stream.Send)
}

// HTTPRequest is the body of POST /chat: a question, or a whole
// conversation, and the door.
type HTTPRequest struct {
	// Message is the user's question; with Messages, it is added last.
	Message string `json:"message"`
	// Messages are the conversation so far: {"role": "user"|"assistant",
	// "text": ...}.
	Messages []struct {
		Role string `json:"role"`
		Text string `json:"text"`
	} `json:"messages"`
	// Door is "code" (the default) or "direct".
	Door string `json:"door"`
}

// maxHTTPBody bounds POST /chat's body, besides the edge's own limit.
const maxHTTPBody = 4 << 20

// HTTPHandler serves POST /chat: the body is an HTTPRequest, the answer a
// stream of JSON lines (application/x-ndjson), each a ChatResponse in
// protojson, the last a done. An error before the stream starts is a
// JSON {"error": ..., "code": ...} with the HTTP status of its code.
func (h Handler) HTTPHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeError(w, connect.NewError(connect.CodeUnimplemented, errors.New("POST a JSON body {\"message\": ..., \"door\": \"code\"|\"direct\"}")))
			return
		}
		req, err := readHTTPRequest(r)
		if err != nil {
			writeError(w, connect.NewError(connect.CodeInvalidArgument, err))
			return
		}
		started := false
		rc := http.NewResponseController(w)
		send := func(ev *edgev1.ChatResponse) error {
			if !started {
				w.Header().Set("Content-Type", "application/x-ndjson")
				w.Header().Set("X-Content-Type-Options", "nosniff")
				w.WriteHeader(http.StatusOK)
				started = true
			}
			b, err := protojson.Marshal(ev)
			if err != nil {
				return err
			}
			if _, err := w.Write(append(b, '\n')); err != nil {
				return err
			}
			return rc.Flush()
		}
		if err := h.s.Chat(r.Context(), r.Header, req, send); err != nil && !started {
			writeError(w, err)
		}
	})
}

func readHTTPRequest(r *http.Request) (*edgev1.ChatRequest, error) {
	var body HTTPRequest
	dec := json.NewDecoder(io.LimitReader(r.Body, maxHTTPBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		return nil, fmt.Errorf("read the body: %w", err)
	}
	req := &edgev1.ChatRequest{}
	switch body.Door {
	case "", "code":
		req.Door = edgev1.Door_DOOR_CODE
	case "direct":
		req.Door = edgev1.Door_DOOR_DIRECT
	default:
		return nil, fmt.Errorf("door %q: want code or direct", body.Door)
	}
	for _, m := range body.Messages {
		role := edgev1.ChatMessage_ROLE_UNSPECIFIED
		switch m.Role {
		case "user":
			role = edgev1.ChatMessage_ROLE_USER
		case "assistant":
			role = edgev1.ChatMessage_ROLE_ASSISTANT
		default:
			return nil, fmt.Errorf("message role %q: want user or assistant", m.Role)
		}
		req.Messages = append(req.Messages, &edgev1.ChatMessage{Role: role, Text: m.Text})
	}
	if body.Message != "" {
		req.Messages = append(req.Messages, &edgev1.ChatMessage{Role: edgev1.ChatMessage_ROLE_USER, Text: body.Message})
	}
	if err := protovalidate.Validate(req); err != nil {
		return nil, err
	}
	return req, nil
}

// writeError answers err as JSON with the HTTP status of its code.
func writeError(w http.ResponseWriter, err error) {
	code := connect.CodeOf(err)
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus(code))
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg, "code": code.String()})
}

func httpStatus(code connect.Code) int {
	switch code {
	case connect.CodeInvalidArgument:
		return http.StatusBadRequest
	case connect.CodeFailedPrecondition:
		return http.StatusPreconditionFailed
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeUnimplemented:
		return http.StatusMethodNotAllowed
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeCanceled:
		return 499
	}
	return http.StatusInternalServerError
}
