package mcpserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/codemode-go/codemode/edge/internal/tenant"
)

// What the SDK's streamable HTTP handler answers, as plain text, for a
// session id it does not know (HTTP 404) and for one that belongs to
// another user (HTTP 403).
const (
	sdkSessionNotFound = "session not found"
	sdkUserMismatch    = "session user mismatch"
)

// sessionIDHeader names the MCP session of a request.
const sessionIDHeader = "Mcp-Session-Id"

// bindSessions makes every MCP session of h belong to whoever opened it:
// the tenant the edge authenticated and the credential that showed it
// (see ownerOf). A request that names a session with another owner, by
// any method (POST, GET, DELETE), is answered exactly as one naming an
// unknown session: HTTP 404 "session not found", before the SDK hands it
// to the session, so it has no effect there (a DELETE closes nothing).
//
// The SDK keeps the owner itself: a session remembers the UserID of the
// auth.TokenInfo in the context of the request that opened it, and refuses
// a later request whose UserID differs, before touching the session. The
// SDK's only way to put a TokenInfo in a context is auth.RequireBearerToken,
// which reads it from an Authorization header; so the owner goes to it as
// the bearer token of a copy of the request, and the request goes on with
// its own header. The SDK refuses with 403 "session user mismatch", which
// would tell a caller that the id exists; that answer becomes the 404 of an
// unknown id.
func bindSessions(h http.Handler) http.Handler {
	withOwner := auth.RequireBearerToken(func(_ context.Context, owner string, _ *http.Request) (*auth.TokenInfo, error) {
		return &auth.TokenInfo{UserID: owner}, nil
	}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		header := r.Header
		tagged := r.Clone(r.Context())
		tagged.Header.Set("Authorization", "Bearer "+ownerOf(r))
		withOwner(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header = header
			if r.Header.Get(sessionIDHeader) == "" {
				h.ServeHTTP(w, r)
				return
			}
			nw := &notFoundWriter{ResponseWriter: w}
			h.ServeHTTP(nw, r)
			nw.finish()
		})).ServeHTTP(w, tagged)
	})
}

// ownerOf names who makes request r, for the sessions it opens: a hash of
// the tenant the edge authenticated (put in r's context by
// tenant.Resolver.Authenticate; "" where nothing authenticates) and of the
// Authorization header it was shown. With API keys the key decides the
// tenant; without them every caller is the tenant anonymous, and a session
// still belongs to the credential, if any, its client sent.
//
// A caller with a token (whose identity has a subject) is its subject, not
// the token: a client that refreshes its token keeps its sessions.
func ownerOf(r *http.Request) string {
	id, _ := tenant.IdentityFromContext(r.Context())
	h := sha256.New()
	h.Write([]byte(id.Tenant))
	h.Write([]byte{0})
	if id.Subject != "" {
		h.Write([]byte("subject:" + id.Subject))
	} else {
		h.Write([]byte(r.Header.Get("Authorization")))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// notFoundWriter holds back a plain-text 403 from the SDK and, when it is
// the SDK's refusal of another user's session, answers the 404 of an
// unknown session instead; everything else passes through.
type notFoundWriter struct {
	http.ResponseWriter
	held bool
	body bytes.Buffer
}

func (w *notFoundWriter) WriteHeader(status int) {
	if status == http.StatusForbidden && strings.HasPrefix(w.Header().Get("Content-Type"), "text/plain") {
		w.held = true
		return
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *notFoundWriter) Write(b []byte) (int, error) {
	if w.held {
		if w.body.Len() < 4096 {
			w.body.Write(b)
		}
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// Flush passes flushes through, for server-sent events.
func (w *notFoundWriter) Flush() {
	if !w.held {
		if f, ok := w.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
	}
}

// Unwrap gives http.ResponseController the underlying writer.
func (w *notFoundWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *notFoundWriter) finish() {
	if !w.held {
		return
	}
	if strings.TrimSpace(w.body.String()) == sdkUserMismatch {
		http.Error(w.ResponseWriter, sdkSessionNotFound, http.StatusNotFound)
		return
	}
	w.ResponseWriter.WriteHeader(http.StatusForbidden)
	_, _ = w.ResponseWriter.Write(w.body.Bytes())
}
