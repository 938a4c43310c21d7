// Package runhttp serves the original coderunner's HTTP API: POST /run,
// JSON {code, language, sessionId} -> {output, error, exitCode, ...}, and
// GET /status. It is the one implementation of both for every service that
// serves them: the edge's public door (edge/internal/runapi, behind API keys
// and policies) and the control plane's internal one (behind the cluster
// secret). The request body, its limits, the answer's shape, the error text
// and the HTTP statuses are decided here; a service says only how a run is
// made (RunFunc) and what its /status reports (StatusFunc).
//
// The handlers hold no state of their own and are safe for concurrent use
// when their functions are.
package runhttp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
)

// MaxRunBody bounds the JSON body of POST /run: the code limit plus room for
// the other fields and JSON escaping. A larger body is answered 413.
const MaxRunBody = 2 << 20

// RunRequest is the original coderunner's POST /run body.
type RunRequest struct {
	Code string `json:"code"`
	// Language is matched without regard to case; empty means python.
	Language string `json:"language"`
	// SessionID runs the code in the caller's session of that id, opening
	// it on first use; empty for a fresh sandbox.
	SessionID string `json:"sessionId"`
	// Stdin is given to the program's standard input (an addition to the
	// original's body).
	Stdin string `json:"stdin,omitempty"`
}

// RunResponse is the original's answer, {output, error}, with the exit
// status and flags added for clients that want them. When the run could not
// be made, Output is empty, Error says why and ExitCode is -1.
type RunResponse struct {
	Output    string `json:"output"`
	Error     string `json:"error"`
	ExitCode  int32  `json:"exitCode"`
	TimedOut  bool   `json:"timedOut,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	OOMKilled bool   `json:"oomKilled,omitempty"`
}

// RunFunc makes the run a POST /run asks for: ex is the body's execution,
// its language lower-cased and trimmed; requestID is the request's
// X-Request-Id. An error is a run that could not be made: its Connect code
// picks the HTTP status (server.HTTPStatus), its message is the answer's
// error, and a Retry-After in its metadata is passed on. The message goes to
// the caller as it is.
type RunFunc func(ctx context.Context, ex *executionv1.Execution, requestID string) (*executionv1.Result, error)

// RunOption configures RunHandler.
type RunOption func(*runOptions)

type runOptions struct {
	anyContentType bool
}

// AnyContentType takes a POST /run body of any Content-Type as JSON, as
// the original did, for a door that keeps web pages out otherwise (the
// control plane refuses every request that carries an Origin). Without
// it, the body must be sent as application/json.
func AnyContentType() RunOption {
	return func(o *runOptions) { o.anyContentType = true }
}

// RunHandler returns the handler of POST /run, making each run with run.
// The body must be sent as Content-Type application/json (415 otherwise,
// unless AnyContentType), which no web page can send to another origin
// without the server's consent. output is the program's stdout; error is
// its stderr, followed by a line saying why it ended when it did not exit
// 0, or the reason the run could not be made, with the HTTP status Connect
// uses for the error's code (403 for a policy's denial, 404 for a session
// that is gone, 429 for a tenant over its limits, ...).
func RunHandler(run RunFunc, opts ...RunOption) http.Handler {
	var o runOptions
	for _, opt := range opts {
		opt(&o)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeRunError(w, http.StatusMethodNotAllowed, "method not allowed: use POST")
			return
		}
		// A web page may send any other body type (text/plain, a form)
		// without asking the server first (a CORS preflight): only JSON runs.
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); !o.anyContentType && (err != nil || mt != "application/json") {
			writeRunError(w, http.StatusUnsupportedMediaType, "unsupported Content-Type: send the body as application/json")
			return
		}
		var in RunRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxRunBody)).Decode(&in); err != nil {
			if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
				writeRunError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", mbe.Limit))
				return
			}
			writeRunError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
			return
		}
		// The original's clients often send no language: the run takes
		// python then, as on every door. Names match without regard to case.
		lang := strings.ToLower(strings.TrimSpace(in.Language))
		ex := &executionv1.Execution{Language: lang, Code: in.Code, SessionId: in.SessionID, Stdin: []byte(in.Stdin)}
		res, err := run(r.Context(), ex, r.Header.Get(server.RequestIDHeader))
		if err != nil {
			writeRunError(w, errorStatus(w, err), Message(err))
			return
		}
		writeJSON(w, http.StatusOK, RunResponse{
			Output:    res.GetStdout(),
			Error:     errorText(res),
			ExitCode:  res.GetExitCode(),
			TimedOut:  res.GetTimedOut(),
			Truncated: res.GetTruncated(),
			OOMKilled: res.GetOomKilled(),
		})
	})
}

// errorText is the original's error field for a run that was made: its
// stderr, then a line for each way the run ended other than exit 0.
func errorText(res *executionv1.Result) string {
	text := res.GetStderr()
	switch {
	case res.GetTimedOut():
		text += fmt.Sprintf("\ntimed out after %s", res.GetDuration().AsDuration().Round(time.Millisecond))
	case res.GetOomKilled():
		text += "\nkilled: out of memory"
	case res.GetExitCode() != 0:
		text += fmt.Sprintf("\nexit status %d", res.GetExitCode())
	}
	if res.GetTruncated() {
		text += "\noutput truncated"
	}
	return strings.TrimPrefix(text, "\n")
}

// StatusFunc reports the status GET /status shows its caller: report is
// the answer, written as JSON; healthy says whether some agent is, for
// 200 OK, or none is, for 503. With an error, report is still the answer
// (the function says in it what went wrong, see Message), with the HTTP
// status Connect uses for the error's code.
type StatusFunc func(ctx context.Context, requestID string) (report any, healthy bool, err error)

// StatusHandler returns the handler of GET (and HEAD) /status, answering
// what status reports.
func StatusHandler(status StatusFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		report, healthy, err := status(r.Context(), r.Header.Get(server.RequestIDHeader))
		code := http.StatusServiceUnavailable
		switch {
		case err != nil:
			code = errorStatus(w, err)
		case healthy:
			code = http.StatusOK
		}
		writeJSON(w, code, report)
	})
}

// errorStatus returns the HTTP status Connect uses for err's code, and
// passes on err's Retry-After hint to w, if it has one.
func errorStatus(w http.ResponseWriter, err error) int {
	var ce *connect.Error
	if errors.As(err, &ce) {
		if v := ce.Meta().Get("Retry-After"); v != "" {
			w.Header().Set("Retry-After", v)
		}
	}
	return server.HTTPStatus(connect.CodeOf(err))
}

// Message is err's message without the Connect code's prefix: the errors
// of the services' execution paths are written for their callers already.
func Message(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

func writeRunError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, RunResponse{Error: msg, ExitCode: -1})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
