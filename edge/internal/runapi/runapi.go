// Package runapi serves the original coderunner's HTTP API at the edge, so
// that its users can point at the public door: POST /run, JSON {code,
// language, sessionId} -> {output, error, exitCode, ...}, and GET /status.
//
// Both are thin adapters over the edge's execution.Service (door "http"):
// a run goes through the same validation, tenant scoping, limits and Wasm
// policies as every other door. The tenant is the one the edge's
// authentication put in the request's context (tenant.FromContext); a
// request without one is a wiring bug and is answered 500.
//
// The handlers hold no state and are safe for concurrent use.
package runapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/edge/internal/execution"
	"github.com/codemode-go/codemode/edge/internal/tenant"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
)

// Door is the name of this door in execution calls and logs.
const Door = "http"

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

// RunHandler returns the handler of POST /run. The body must be sent as
// Content-Type application/json (415 otherwise), which no web page can send
// to another origin without the server's consent. output is the program's stdout;
// error is its stderr, followed by a line saying why it ended when it did
// not exit 0, or the reason the run could not be made, with the HTTP status
// Connect uses for the error's code (403 for a policy's denial, 404 for a
// session that is gone, 429 for a tenant over its limits, ...).
func RunHandler(svc *execution.Service) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeRunError(w, http.StatusMethodNotAllowed, "method not allowed: use POST")
			return
		}
		// A web page may send any other body type (text/plain, a form)
		// without asking the server first (a CORS preflight): only JSON runs.
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			writeRunError(w, http.StatusUnsupportedMediaType, "unsupported Content-Type: send the body as application/json")
			return
		}
		t, ok := tenant.FromContext(r.Context())
		if !ok {
			writeRunError(w, http.StatusInternalServerError, "internal error: the request has no tenant")
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
		// The original's clients often send no language: the Service takes
		// python then, as on every door. Names match without regard to case.
		lang := strings.ToLower(strings.TrimSpace(in.Language))
		res, err := svc.Execute(r.Context(), execution.Call{
			Execution: &executionv1.Execution{Language: lang, Code: in.Code, SessionId: in.SessionID, Stdin: []byte(in.Stdin)},
			Tenant:    t,
			Door:      Door,
			RequestID: r.Header.Get(server.RequestIDHeader),
		})
		if err != nil {
			writeRunError(w, errorStatus(w, err), message(err))
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

// Status is the answer of GET /status, for one tenant: the cluster's
// health and the tenant's own sessions. It carries nothing of what other
// tenants do: no busy, warm or free sandboxes, no sessions but the caller's.
type Status struct {
	// Status is "ok" when some agent is healthy, else "unavailable" (HTTP 503).
	Status        string  `json:"status"`
	HealthyAgents int     `json:"healthyAgents"`
	Agents        []Agent `json:"agents"`
	// Sessions are the caller's open sessions, on every agent.
	Sessions int32 `json:"sessions"`
	// Languages are those some healthy agent runs.
	Languages []Language `json:"languages"`
	// Error says why the agents could not be listed, if they could not.
	Error string `json:"error,omitempty"`
}

// Agent is one agent in Status: its name, health and size, and the
// caller's sessions on it; never its address or its load.
type Agent struct {
	// Name is the agent's own name; empty for an agent that has not answered yet.
	Name    string `json:"name"`
	Healthy bool   `json:"healthy"`
	// Sessions are the caller's open sessions on the agent.
	Sessions int32 `json:"sessions"`
	// Capacity is the sandboxes the agent may hold, as configured.
	Capacity int32 `json:"capacity"`
}

// Language is one language in Status.
type Language struct {
	Name    string `json:"name"`
	Version string `json:"version,omitempty"`
}

// StatusHandler returns the handler of GET /status: the agents by name
// with their health and the caller's sessions on each, and the languages
// they run. The agents' addresses are internal and never leave the edge;
// their load, and other tenants' sessions, are other tenants' business.
func StatusHandler(svc *execution.Service) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		t, ok := tenant.FromContext(r.Context())
		if !ok {
			http.Error(w, "internal error: the request has no tenant", http.StatusInternalServerError)
			return
		}
		out := Status{Status: "unavailable", Agents: []Agent{}, Languages: []Language{}}
		agents, err := svc.Agents(r.Context(), execution.Caller{Tenant: t, Door: Door, RequestID: r.Header.Get(server.RequestIDHeader)})
		if err != nil {
			out.Error = message(err)
			writeJSON(w, errorStatus(w, err), out)
			return
		}
		langs := make(map[string]Language)
		for _, a := range agents {
			st := a.GetStatus()
			mine := st.GetTenantSessions()[t]
			out.Sessions += mine
			out.Agents = append(out.Agents, Agent{Name: st.GetName(), Healthy: a.GetHealthy(), Sessions: mine, Capacity: st.GetCapacity()})
			if !a.GetHealthy() {
				continue
			}
			out.HealthyAgents++
			for _, l := range st.GetLanguages() {
				if _, seen := langs[l.GetName()]; !seen {
					langs[l.GetName()] = Language{Name: l.GetName(), Version: l.GetVersion()}
				}
			}
		}
		for _, l := range langs {
			out.Languages = append(out.Languages, l)
		}
		sort.Slice(out.Languages, func(i, j int) bool { return out.Languages[i].Name < out.Languages[j].Name })
		code := http.StatusServiceUnavailable
		if out.HealthyAgents > 0 {
			out.Status, code = "ok", http.StatusOK
		}
		writeJSON(w, code, out)
	})
}

// errorStatus returns the HTTP status Connect uses for err's code, and
// passes on err's Retry-After hint, if it has one.
func errorStatus(w http.ResponseWriter, err error) int {
	var ce *connect.Error
	if errors.As(err, &ce) {
		if v := ce.Meta().Get("Retry-After"); v != "" {
			w.Header().Set("Retry-After", v)
		}
	}
	return server.HTTPStatus(connect.CodeOf(err))
}

// message is err's message without the code prefix: execution.Service's
// errors are written for the public already.
func message(err error) string {
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
