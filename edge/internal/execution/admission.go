package execution

import (
	"context"
	"errors"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/codemode-go/codemode/edge/internal/admission"
)

// WithAdmission limits each tenant's calls that reach the control plane
// (runs, sessions, files) with l; nil: no limits.
func WithAdmission(l *admission.Limiter) Option {
	return func(s *Service) { s.admission = l }
}

// admit lets a call of tenant in, or refuses it with resource_exhausted
// when the tenant is over its limits: the message says which limit and when
// to retry, and the error's metadata carries a Retry-After header (whole
// seconds, as HTTP wants it) for the doors that send headers. release must
// be called when the call has ended.
func (s *Service) admit(_ context.Context, tenant string) (release func(), err error) {
	if s.admission == nil {
		return func() {}, nil
	}
	release, err = s.admission.Acquire(tenant)
	if err == nil {
		return release, nil
	}
	ce := connect.NewError(connect.CodeResourceExhausted, err)
	if ex := (*admission.ExceededError)(nil); errors.As(err, &ex) {
		ce.Meta().Set("Retry-After", retryAfter(ex.RetryAfter))
	}
	return nil, ce
}

// retryAfter is d as an HTTP Retry-After value: whole seconds, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.FormatInt(max(1, int64((d+time.Second-1)/time.Second)), 10)
}
