package policy

import (
	"context"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"github.com/codemode-go/codemode/gen/codemode/policy/v1/policyv1connect"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Status reports the serving generation, its policies and counters, and the
// last reload attempt, as the admin service returns it.
func (e *Engine) Status() *policyv1.ListPoliciesResponse {
	g := e.acquire()
	defer g.release()
	resp := &policyv1.ListPoliciesResponse{
		Generation:   g.id,
		LoadTime:     timestamppb.New(g.loadTime),
		ConfigSha256: g.configSHA,
	}
	for _, ms := range [][]*module{g.request, g.result} {
		for _, m := range ms {
			c := m.counters
			resp.Policies = append(resp.Policies, &policyv1.PolicyStatus{
				Name:        m.cfg.Name,
				Sha256:      m.sha256,
				Phase:       m.cfg.Phase,
				Order:       int32(m.cfg.Order),
				FailureMode: m.cfg.FailureMode,
				PoolSize:    int32(m.pool.size()),
				Interrupt:   m.interruptMode(),
				Counters: &policyv1.PolicyCounters{
					Allowed:           c.allowed.Load(),
					Denied:            c.denied.Load(),
					Traps:             c.traps.Load(),
					Timeouts:          c.timeouts.Load(),
					InvalidDecisions:  c.invalid.Load(),
					FailedOpen:        c.failedOpen.Load(),
					InstancesReplaced: c.replaced.Load(),
					Unavailable:       c.unavailable.Load(),
					FuelExhausted:     c.fuelExhausted.Load(),
				},
			})
		}
	}
	e.statusMu.Lock()
	if e.lastErr != nil {
		resp.LastReloadError = e.lastErr.Error()
	}
	if !e.lastReload.IsZero() {
		resp.LastReloadTime = timestamppb.New(e.lastReload)
	}
	e.statusMu.Unlock()
	return resp
}

// adminService implements policyv1connect.PolicyAdminServiceHandler.
type adminService struct{ engine *Engine }

var _ policyv1connect.PolicyAdminServiceHandler = (*adminService)(nil)

func (s *adminService) ListPolicies(context.Context, *connect.Request[policyv1.ListPoliciesRequest]) (*connect.Response[policyv1.ListPoliciesResponse], error) {
	return connect.NewResponse(s.engine.Status()), nil
}

func (s *adminService) Reload(ctx context.Context, _ *connect.Request[policyv1.ReloadRequest]) (*connect.Response[policyv1.ReloadResponse], error) {
	changed, err := s.engine.Reload(ctx)
	if err != nil {
		// The operator sees the load error: it is theirs (paths included).
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewResponse(&policyv1.ReloadResponse{Generation: s.engine.Generation(), Changed: changed}), nil
}

// NewAdminHandler returns the path and handler of the PolicyAdminService for
// e. Every call must carry "Authorization: Bearer <token>"; with an empty
// token every call is refused, so the service is off until a token is set.
func NewAdminHandler(e *Engine, token string, opts ...connect.HandlerOption) (string, http.Handler) {
	opts = append([]connect.HandlerOption{connect.WithInterceptors(bearerAuth(token))}, opts...)
	return policyv1connect.NewPolicyAdminServiceHandler(&adminService{engine: e}, opts...)
}

// bearerAuth refuses calls without the admin token.
func bearerAuth(token string) connect.UnaryInterceptorFunc {
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if token == "" {
				return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("policy admin is disabled: no admin token configured"))
			}
			got, ok := strings.CutPrefix(req.Header().Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
				return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("missing or wrong admin token"))
			}
			return next(ctx, req)
		}
	}
}
