package controlplaned

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"buf.build/go/protovalidate"
	"connectrpc.com/connect"

	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
)

// maxRunBody bounds the JSON body of POST /run: the code limit plus room for
// the other fields and JSON escaping.
const maxRunBody = 2 << 20

// runRequest is the original coderunner's POST /run body.
type runRequest struct {
	Code      string `json:"code"`
	Language  string `json:"language"`
	SessionID string `json:"sessionId"`
	Stdin     string `json:"stdin,omitempty"`
}

// runResponse is the original's answer, {output, error}, with the exit
// status and flags added for clients that want them.
type runResponse struct {
	Output    string `json:"output"`
	Error     string `json:"error"`
	ExitCode  int32  `json:"exitCode"`
	TimedOut  bool   `json:"timedOut,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	OOMKilled bool   `json:"oomKilled,omitempty"`
}

// handleRun serves the seed-compatible POST /run. output is the program's
// stdout; error is its stderr, followed by a line saying why it ended when it
// did not exit 0, or the reason the run could not be made.
func (s *Service) handleRun(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeJSON(w, http.StatusMethodNotAllowed, runResponse{Error: "method not allowed: use POST", ExitCode: -1})
		return
	}
	var in runRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRunBody))
	if err := dec.Decode(&in); err != nil {
		writeJSON(w, http.StatusBadRequest, runResponse{Error: "invalid JSON body: " + err.Error(), ExitCode: -1})
		return
	}
	ex := &executionv1.Execution{Code: in.Code, Language: strings.ToLower(in.Language), SessionId: in.SessionID, Stdin: []byte(in.Stdin)}
	if err := protovalidate.Validate(&cpv1.ExecuteRequest{Execution: ex}); err != nil {
		writeJSON(w, http.StatusBadRequest, runResponse{Error: err.Error(), ExitCode: -1})
		return
	}
	start, reqID := time.Now(), requestID(r.Header.Get(server.RequestIDHeader))
	res, err := s.execute(r.Context(), "", ex, nil, nil, reqID)
	s.logExecution(r.Context(), "http", reqID, "", ex, res, err, start)
	if err != nil {
		writeJSON(w, httpStatus(err), runResponse{Error: connectMessage(err), ExitCode: -1})
		return
	}
	errText := res.GetStderr()
	switch {
	case res.GetTimedOut():
		errText += fmt.Sprintf("\ntimed out after %s", res.GetDuration().AsDuration().Round(1e6))
	case res.GetOomKilled():
		errText += "\nkilled: out of memory"
	case res.GetExitCode() != 0:
		errText += fmt.Sprintf("\nexit status %d", res.GetExitCode())
	}
	if res.GetTruncated() {
		errText += "\noutput truncated"
	}
	writeJSON(w, http.StatusOK, runResponse{
		Output:    res.GetStdout(),
		Error:     strings.TrimPrefix(errText, "\n"),
		ExitCode:  res.GetExitCode(),
		TimedOut:  res.GetTimedOut(),
		Truncated: res.GetTruncated(),
		OOMKilled: res.GetOomKilled(),
	})
}

type statusAgent struct {
	Address  string `json:"address"`
	Healthy  bool   `json:"healthy"`
	Warm     int32  `json:"warm"`
	Busy     int32  `json:"busy"`
	Sessions int32  `json:"sessions"`
	Capacity int32  `json:"capacity"`
	Free     int32  `json:"free"`
	InFlight int    `json:"inFlight"`
	Error    string `json:"error,omitempty"`
}

// handleStatus serves the seed-compatible GET /status: every agent and its load.
func (s *Service) handleStatus(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	var agents []statusAgent
	healthy := 0
	for _, a := range s.router.Agents() {
		if a.Healthy {
			healthy++
		}
		agents = append(agents, statusAgent{
			Address: a.Address, Healthy: a.Healthy, InFlight: a.InFlight, Error: a.Error,
			Warm: a.Status.GetWarm(), Busy: a.Status.GetBusy(), Sessions: a.Status.GetSessions(),
			Capacity: a.Status.GetCapacity(), Free: a.Status.GetFree(),
		})
	}
	status := "ok"
	code := http.StatusOK
	if healthy == 0 {
		status, code = "unavailable", http.StatusServiceUnavailable
	}
	writeJSON(w, code, map[string]any{"status": status, "healthyAgents": healthy, "agents": agents})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func connectMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// httpStatus maps a Connect error to the HTTP status the Connect protocol uses for it.
func httpStatus(err error) int {
	switch connect.CodeOf(err) {
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeCanceled:
		return 499
	}
	return http.StatusInternalServerError
}
