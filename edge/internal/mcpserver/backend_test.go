package mcpserver

import (
	"crypto/rand"
	"errors"
	"net/http"
	"testing"

	"github.com/codemode-go/codemode/edge/internal/tenant"
)

// TestLocalTenantIsTheRequests checks that the tenant a tool call runs as
// is the one of the key its own request carries, not the one in its
// context, which is the context of the request that opened the session.
func TestLocalTenantIsTheRequests(t *testing.T) {
	keyA, keyB := "ka-"+rand.Text(), "kb-"+rand.Text()
	tenants, err := tenant.New(map[string]string{keyA: "alpha", keyB: "beta"})
	if err != nil {
		t.Fatal(err)
	}
	open := Local(nil, nil, tenants)
	ctx := tenant.NewContext(t.Context(), "alpha")
	b, _, err := open(ctx, http.Header{"Authorization": {"Bearer " + keyB}})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.(*local).c.Tenant; got != "beta" {
		t.Errorf("a call with beta's key in a session alpha opened runs as %q, want beta", got)
	}
	if _, _, err := open(ctx, http.Header{"Authorization": {"Bearer not-a-key-of-anyone"}}); !errors.Is(err, tenant.ErrUnauthenticated) {
		t.Errorf("a call with an unknown key in a session alpha opened: %v, want %v", err, tenant.ErrUnauthenticated)
	}
}
