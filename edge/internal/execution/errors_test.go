package execution

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	"connectrpc.com/connect"
)

func TestPublicErrorOfALostControlPlane(t *testing.T) {
	t.Parallel()
	s := New(nil, nil)
	c := Caller{RequestID: "r1", Tenant: "t1"}
	for _, tc := range []struct {
		name string
		err  error
		want connect.Code
	}{
		// connect's client calls a reset connection canceled.
		{"connection reset", connect.NewError(connect.CodeCanceled, fmt.Errorf("read tcp: %w", syscall.ECONNRESET)), connect.CodeUnavailable},
		{"broken pipe", connect.NewError(connect.CodeCanceled, fmt.Errorf("write tcp: %w", syscall.EPIPE)), connect.CodeUnavailable},
		{"refused", connect.NewError(connect.CodeUnavailable, fmt.Errorf("dial tcp: %w", syscall.ECONNREFUSED)), connect.CodeUnavailable},
		{"the caller went away", connect.NewError(connect.CodeCanceled, context.Canceled), connect.CodeCanceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := connect.CodeOf(s.public(c, "", tc.err)); got != tc.want {
				t.Errorf("code %v, want %v", got, tc.want)
			}
		})
	}
}
