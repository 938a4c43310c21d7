package edged

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/codemode-go/codemode/edge/internal/oidctoken"
	"github.com/codemode-go/codemode/edge/internal/tenant"
)

// metadataPath is where Protected Resource Metadata (RFC 9728) is served:
// for the origin itself, and followed by an MCP endpoint's path for that
// endpoint.
const metadataPath = "/.well-known/oauth-protected-resource"

// mcpPaths are the MCP endpoints: each is a protected resource in the
// sense of the MCP authorization specification.
var mcpPaths = []string{"/mcp", "/no-code/mcp", "/mcp-no-code-execute"}

// mcpAuth makes the MCP endpoints OAuth 2.1 resource servers, as the MCP
// authorization specification asks: it serves their Protected Resource
// Metadata, naming the trusted issuers as authorization servers, and says
// where to find it in the WWW-Authenticate challenge of every refusal, so
// that a client can find the provider, get a token for the resource and
// try again. It exists only when the edge trusts an issuer.
type mcpAuth struct {
	publicURL string // "": from each request
	issuers   []string
	scopes    []string
}

func newMCPAuth(publicURL string, v *oidctoken.Verifier) *mcpAuth {
	if v == nil {
		return nil
	}
	return &mcpAuth{publicURL: strings.TrimRight(publicURL, "/"), issuers: v.Issuers(), scopes: v.Scopes()}
}

// base is the edge's URL as its clients reach it: the configured public
// URL, else the request's scheme and host.
func (a *mcpAuth) base(r *http.Request) string {
	if a.publicURL != "" {
		return a.publicURL
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// isMCP reports whether path is an MCP endpoint.
func isMCP(path string) bool {
	for _, p := range mcpPaths {
		if path == p {
			return true
		}
	}
	return false
}

// challenge returns err (a refusal of a request to the MCP endpoint
// r.URL.Path) with the WWW-Authenticate challenge RFC 9728 and RFC 6750
// ask for: resource_metadata always; error="invalid_token" when a bearer
// was sent but refused; error="insufficient_scope" and the scope needed
// when the token lacks it.
func (a *mcpAuth) challenge(r *http.Request, err error) error {
	var ce *connect.Error
	if !errors.As(err, &ce) {
		ce = connect.NewError(connect.CodeUnauthenticated, err)
	}
	params := []string{fmt.Sprintf("resource_metadata=%q", a.base(r)+metadataPath+r.URL.Path)}
	prev := ce.Meta().Get("WWW-Authenticate")
	switch {
	case strings.Contains(prev, `error="insufficient_scope"`):
		params = append([]string{strings.TrimPrefix(prev, "Bearer ")}, params...)
	case r.Header.Get("Authorization") != "":
		params = append([]string{`error="invalid_token"`, fmt.Sprintf("error_description=%q", quotable(ce.Message()))}, params...)
	}
	ce.Meta().Set("WWW-Authenticate", "Bearer "+strings.Join(params, ", "))
	return ce
}

// quotable makes s safe inside a quoted-string of a challenge.
func quotable(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '"' || r == '\\' || r < 0x20 || r > 0x7e {
			return '\''
		}
		return r
	}, s)
}

// handle mounts the metadata of the origin and of each MCP endpoint.
func (a *mcpAuth) handle(mount func(pattern string, h http.Handler)) {
	for _, p := range append([]string{""}, mcpPaths...) {
		mount(metadataPath+p, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			md := &oauthex.ProtectedResourceMetadata{
				Resource:               a.base(r) + p,
				AuthorizationServers:   a.issuers,
				ScopesSupported:        a.scopes,
				BearerMethodsSupported: []string{"header"},
				ResourceName:           "codemode",
			}
			auth.ProtectedResourceMetadataHandler(md).ServeHTTP(w, r)
		}))
	}
}

// authenticate resolves the identity of a request to a door, before its
// body is read, and refuses one without the right the door needs. With
// ma, refusals at the MCP endpoints carry its challenge.
func authenticate(tenants *tenant.Resolver, ma *mcpAuth) func(*http.Request) (context.Context, error) {
	return func(r *http.Request) (context.Context, error) {
		if !needsKey(r.URL.Path) {
			return r.Context(), nil
		}
		ctx, err := tenants.Authenticate(r)
		if err == nil {
			id, _ := tenant.IdentityFromContext(ctx)
			err = tenant.Require(id, rightFor(r.URL.Path))
		} else {
			err = connect.NewError(tenant.Code(err), err)
		}
		if err != nil {
			if ma != nil && isMCP(r.URL.Path) {
				err = ma.challenge(r, err)
			}
			return nil, err
		}
		return ctx, nil
	}
}
