package execution

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/edge/internal/ratelimit"
)

// WithAdmission limits each tenant's calls that reach the control plane
// (runs, sessions, files) with l; nil: no limits.
func WithAdmission(l *ratelimit.Limiter) Option {
	return func(s *Service) { s.admission = l }
}

// admit lets a call of tenant in, or refuses it with resource_exhausted
// when the tenant is over its limits: the message says which limit and when
// to retry, with a Retry-After hint (see ratelimit.ExceededError.ConnectError).
// release must be called when the call has ended.
func (s *Service) admit(_ context.Context, tenant string) (release func(), err error) {
	if s.admission == nil {
		return func() {}, nil
	}
	release, err = s.admission.Acquire(tenant)
	if err == nil {
		return release, nil
	}
	if ex := (*ratelimit.ExceededError)(nil); errors.As(err, &ex) {
		return nil, ex.ConnectError()
	}
	return nil, connect.NewError(connect.CodeResourceExhausted, err)
}
