package controlplaned

import (
	"context"
	"time"

	"buf.build/go/protovalidate"
	"connectrpc.com/connect"

	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// runHTTP makes the run of the original's POST /run (runhttp.RunHandler):
// validated as Execute's request is, then routed as Execute routes it, for
// no tenant, and logged with door "http".
func (s *Service) runHTTP(ctx context.Context, ex *executionv1.Execution, reqID string) (*executionv1.Result, error) {
	if err := protovalidate.Validate(&cpv1.ExecuteRequest{Execution: ex}); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	start, reqID := time.Now(), requestID(reqID)
	res, err := s.execute(ctx, "", ex, nil, nil, reqID)
	s.logExecution(ctx, "http", reqID, "", ex, res, err, start)
	return res, err
}

// statusAgent is one agent in the control plane's GET /status: all the
// router knows of it, address and load included.
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

// statusHTTP reports the original's GET /status (runhttp.StatusHandler):
// every agent and its load.
func (s *Service) statusHTTP(context.Context, string) (any, bool, error) {
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
	if healthy == 0 {
		status = "unavailable"
	}
	return map[string]any{"status": status, "healthyAgents": healthy, "agents": agents}, healthy > 0, nil
}
