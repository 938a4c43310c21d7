package mcpserver

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"regexp"
)

// newSessionID returns a new MCP session id: 128 random bits as 26
// characters of the RFC 4648 base32 alphabet, what the SDK makes by
// default, fixed here because the logs are searched for that shape.
func newSessionID() string { return rand.Text() }

// sessionIDPattern matches a session id of newSessionID's shape inside
// text.
var sessionIDPattern = regexp.MustCompile(`\b[A-Z2-7]{26}\b`)

// SessionHash is how the logs name an MCP session: the first 12 hex
// digits of the SHA-256 of its id. Whoever holds an MCP session id can
// act in that session, so the id itself is never logged.
func SessionHash(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:6])
}

// hashSessionIDs is a slog.Handler for the SDK's logs that names MCP
// sessions by SessionHash: an attribute session_id (the SDK's key) becomes
// mcp_session with the hash, and any id of newSessionID's shape in the
// message or in another string attribute is replaced by its hash.
type hashSessionIDs struct{ next slog.Handler }

func (h hashSessionIDs) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h hashSessionIDs) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, hashIDsIn(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(hashAttr(a))
		return true
	})
	return h.next.Handle(ctx, out)
}

func (h hashSessionIDs) WithAttrs(as []slog.Attr) slog.Handler {
	hashed := make([]slog.Attr, len(as))
	for i, a := range as {
		hashed[i] = hashAttr(a)
	}
	return hashSessionIDs{h.next.WithAttrs(hashed)}
}

func (h hashSessionIDs) WithGroup(name string) slog.Handler {
	return hashSessionIDs{h.next.WithGroup(name)}
}

func hashAttr(a slog.Attr) slog.Attr {
	a.Value = a.Value.Resolve()
	switch {
	case a.Key == "session_id":
		if id := a.Value.String(); id != "" {
			return slog.String("mcp_session", SessionHash(id))
		}
		return slog.String("mcp_session", "")
	case a.Value.Kind() == slog.KindGroup:
		group := a.Value.Group()
		hashed := make([]slog.Attr, len(group))
		for i, g := range group {
			hashed[i] = hashAttr(g)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(hashed...)}
	case a.Value.Kind() == slog.KindString:
		return slog.String(a.Key, hashIDsIn(a.Value.String()))
	case a.Value.Kind() == slog.KindAny:
		// An error or another value the handler would print: print it
		// here, with any id hashed.
		if v := a.Value.Any(); v != nil {
			if err, ok := v.(error); ok {
				return slog.String(a.Key, hashIDsIn(err.Error()))
			}
		}
	}
	return a
}

// hashIDsIn replaces every session id in s by its hash.
func hashIDsIn(s string) string {
	return sessionIDPattern.ReplaceAllStringFunc(s, SessionHash)
}
