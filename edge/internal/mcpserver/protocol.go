package mcpserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// JSON-RPC error codes.
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
	codeMethodNotFound = -32601
)

// notHandled is how the SDK's streamable HTTP handler words an unknown
// method, which it answers with a plain-text HTTP 400.
const notHandled = "JSON RPC not handled"

// protocol makes h answer inside JSON-RPC what the SDK answers with plain
// HTTP errors: a body that is not JSON gets a parse error (-32700), an
// unknown method -32601 (as a response to the call, HTTP 200), another
// refused message an invalid-request error (-32600) with the SDK's reason,
// and a body over the edge's size limit -32600 with HTTP 413.
func protocol(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			if tooLarge, ok := errors.AsType[*http.MaxBytesError](err); ok {
				WriteError(w, http.StatusRequestEntityTooLarge, nil, codeInvalidRequest,
					fmt.Sprintf("request body is larger than the limit of %d bytes", tooLarge.Limit))
				return
			}
			WriteError(w, http.StatusBadRequest, nil, codeInvalidRequest, "reading the request body: "+err.Error())
			return
		}
		if !json.Valid(body) {
			WriteError(w, http.StatusBadRequest, nil, codeParseError, "the request body is not JSON")
			return
		}
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		_ = json.Unmarshal(body, &msg) // a batch or another shape: the SDK refuses it
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		rw := &rpcErrorWriter{ResponseWriter: w, id: msg.ID, method: msg.Method}
		h.ServeHTTP(rw, r)
		rw.finish()
	})
}

// RefuseTooLarge answers a request whose declared body is over the edge's
// limit, unread: HTTP 413 with a JSON-RPC error (its id is unknown).
func RefuseTooLarge(w http.ResponseWriter, err error) {
	WriteError(w, http.StatusRequestEntityTooLarge, nil, codeInvalidRequest, err.Error())
}

// WriteError answers with a JSON-RPC error response for id (null when nil).
func WriteError(w http.ResponseWriter, status int, id json.RawMessage, code int, message string) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{code, message}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// rpcErrorWriter holds back a plain-text 400 from the SDK and answers it as
// a JSON-RPC error instead; everything else passes through.
type rpcErrorWriter struct {
	http.ResponseWriter
	id      json.RawMessage
	method  string
	held    bool
	heldMsg bytes.Buffer
}

func (w *rpcErrorWriter) WriteHeader(status int) {
	if status == http.StatusBadRequest && strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		w.held = true
		return
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *rpcErrorWriter) Write(b []byte) (int, error) {
	if w.held {
		if w.heldMsg.Len() < 4096 {
			w.heldMsg.Write(b)
		}
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Flush passes flushes through, for server-sent events.
func (w *rpcErrorWriter) Flush() {
	if !w.held {
		if f, ok := w.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
	}
}

// Unwrap gives http.ResponseController the underlying writer.
func (w *rpcErrorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *rpcErrorWriter) finish() {
	if !w.held {
		return
	}
	msg := strings.TrimSpace(w.heldMsg.String())
	w.Header().Del("X-Content-Type-Options")
	if strings.Contains(msg, notHandled) && len(w.id) > 0 && string(w.id) != "null" {
		WriteError(w.ResponseWriter, http.StatusOK, w.id, codeMethodNotFound, fmt.Sprintf("method %q not found", w.method))
		return
	}
	WriteError(w.ResponseWriter, http.StatusBadRequest, w.id, codeInvalidRequest, msg)
}
