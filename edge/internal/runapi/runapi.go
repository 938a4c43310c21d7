// Package runapi serves the original coderunner's HTTP API at the edge, so
// that its users can point at the public door: POST /run, JSON {code,
// language, sessionId} -> {output, error, exitCode, ...}, and GET /status.
//
// Both are internal/runhttp's handlers over the edge's execution.Service
// (door "http"): a run goes through the same validation, tenant scoping,
// limits and Wasm policies as every other door. The tenant is the one the
// edge's authentication put in the request's context (tenant.FromContext);
// a request without one is a wiring bug and is answered 500.
//
// The handlers hold no state and are safe for concurrent use.
package runapi

import (
	"context"
	"errors"
	"net/http"
	"sort"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/edge/internal/execution"
	"github.com/codemode-go/codemode/edge/internal/oidctoken"
	"github.com/codemode-go/codemode/edge/internal/tenant"
	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/runhttp"
)

// Door is the name of this door in execution calls and logs.
const Door = "http"

// errNoTenant answers a request that reached a handler without the
// tenant the edge's authentication puts in its context.
func errNoTenant() error {
	return connect.NewError(connect.CodeInternal, errors.New("internal error: the request has no tenant"))
}

// RunHandler returns the handler of POST /run (see runhttp.RunHandler),
// running the code through svc as the request's tenant.
func RunHandler(svc *execution.Service) http.Handler {
	return runhttp.RunHandler(func(ctx context.Context, ex *executionv1.Execution, requestID string) (*executionv1.Result, error) {
		id, ok := tenant.IdentityFromContext(ctx)
		if !ok {
			return nil, errNoTenant()
		}
		if ex.GetSessionId() != "" {
			// The door checked Execute; a run in a session needs Sessions too.
			if err := tenant.Require(id, oidctoken.Sessions); err != nil {
				return nil, err
			}
		}
		return svc.Execute(ctx, execution.Call{Execution: ex, Tenant: id.Tenant, Door: Door, RequestID: requestID, Subject: id.Subject})
	})
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
	// Preloaded are the modules a run finds already imported (Python's,
	// from each sandbox's preloaded parent).
	Preloaded []string `json:"preloaded,omitempty"`
}

// StatusHandler returns the handler of GET /status: the agents by name
// with their health and the caller's sessions on each, and the languages
// they run. The agents' addresses are internal and never leave the edge;
// their load, and other tenants' sessions, are other tenants' business.
func StatusHandler(svc *execution.Service) http.Handler {
	return runhttp.StatusHandler(func(ctx context.Context, requestID string) (any, bool, error) {
		out := Status{Status: "unavailable", Agents: []Agent{}, Languages: []Language{}}
		t, ok := tenant.FromContext(ctx)
		if !ok {
			err := errNoTenant()
			out.Error = runhttp.Message(err)
			return out, false, err
		}
		agents, err := svc.Agents(ctx, execution.Caller{Tenant: t, Door: Door, RequestID: requestID})
		if err != nil {
			out.Error = runhttp.Message(err)
			return out, false, err
		}
		out.add(t, agents)
		if out.HealthyAgents > 0 {
			out.Status = "ok"
		}
		return out, out.HealthyAgents > 0, nil
	})
}

// add counts agents in s as tenant t sees them, with the languages of the
// healthy ones, each once, by name.
func (s *Status) add(t string, agents []*cpv1.Agent) {
	langs := make(map[string]Language)
	for _, a := range agents {
		st := a.GetStatus()
		mine := st.GetTenantSessions()[t]
		s.Sessions += mine
		s.Agents = append(s.Agents, Agent{Name: st.GetName(), Healthy: a.GetHealthy(), Sessions: mine, Capacity: st.GetCapacity()})
		if !a.GetHealthy() {
			continue
		}
		s.HealthyAgents++
		for _, l := range st.GetLanguages() {
			if _, seen := langs[l.GetName()]; !seen {
				langs[l.GetName()] = Language{Name: l.GetName(), Version: l.GetVersion(), Preloaded: l.GetPreloaded()}
			}
		}
	}
	for _, l := range langs {
		s.Languages = append(s.Languages, l)
	}
	sort.Slice(s.Languages, func(i, j int) bool { return s.Languages[i].Name < s.Languages[j].Name })
}
