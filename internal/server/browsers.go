package server

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"connectrpc.com/connect"
	"connectrpc.com/cors"
)

// Browsers says what web pages a user has open may do with a server. A
// browser lets any page it shows send requests to any address, loopback
// included; two checks keep pages off a server they were not served by:
//
//   - Origins: a request that carries an Origin header naming another
//     origin than the server's own (a page of another site or another port)
//     is refused, with no CORS headers, unless that origin is listed. This
//     covers the requests a page can send without a CORS preflight (a
//     text/plain POST, a form) as well as preflights themselves.
//   - Hosts: a request whose Host header names a host the server does not
//     answer to is refused. This stops DNS rebinding, where a page's own
//     host name is made to resolve to the server's address so that its
//     requests look same-origin. A name can be rebound, an IP address
//     cannot, so IP addresses and "localhost" (which browsers resolve
//     themselves) are always answered.
//
// Requests without an Origin header (curl, SDKs, a browser's navigation to
// the page) are not refused for their origin. Refusals are HTTP 403 with a
// JSON body {"error", "code": "permission_denied"}, whatever the protocol:
// Connect, gRPC and gRPC-Web clients all read an HTTP 403 as
// permission_denied.
type Browsers struct {
	// Origins may call the server from their pages, cross-origin:
	// scheme://host[:port] as a browser sends it in its Origin header (such
	// as https://app.example.com or http://localhost:5173), or "*" for
	// every origin. A page the server serves itself is always allowed.
	Origins []string
	// Hosts are host names, without port, that the server answers to
	// besides IP addresses and localhost; "*" answers to every host. A
	// host name is matched without regard to case, whatever the port.
	Hosts []string
}

// Validate reports whether every origin and host is well formed.
func (b Browsers) Validate() error {
	var errs []error
	for _, o := range b.Origins {
		if _, err := normalOrigin(o); err != nil {
			errs = append(errs, err)
		}
	}
	for _, h := range b.Hosts {
		if _, err := normalHost(h); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// normalOrigin returns o as browsers serialize origins: lower case, with
// no default port and no trailing slash.
func normalOrigin(o string) (string, error) {
	if o == "*" {
		return o, nil
	}
	u, err := url.Parse(strings.TrimSuffix(strings.ToLower(strings.TrimSpace(o)), "/"))
	if err != nil || u.Scheme == "" || u.Host == "" || u.Opaque != "" || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("origin %q: want scheme://host[:port], such as https://app.example.com, or *", o)
	}
	host := u.Host
	if (u.Scheme == "http" && u.Port() == "80") || (u.Scheme == "https" && u.Port() == "443") {
		host = strings.TrimSuffix(host, ":"+u.Port())
	}
	return u.Scheme + "://" + host, nil
}

// normalHost returns h in lower case, checking that it is a bare host name.
func normalHost(h string) (string, error) {
	if h == "*" {
		return h, nil
	}
	h = strings.ToLower(strings.TrimSpace(h))
	if h == "" || strings.ContainsAny(h, ":/[]@ ") {
		return "", fmt.Errorf("host %q: want a host name without scheme or port, such as codemode.example.com, or *", h)
	}
	return h, nil
}

// browserCheck is Browsers compiled for lookups.
type browserCheck struct {
	anyOrigin, anyHost bool
	origins, hosts     map[string]bool
}

// compile returns b ready for lookups; it drops what Validate refuses.
func (b Browsers) compile() *browserCheck {
	c := &browserCheck{origins: make(map[string]bool), hosts: make(map[string]bool)}
	for _, o := range b.Origins {
		n, err := normalOrigin(o)
		switch {
		case err != nil:
		case n == "*":
			c.anyOrigin = true
		default:
			c.origins[n] = true
		}
	}
	for _, h := range b.Hosts {
		n, err := normalHost(h)
		switch {
		case err != nil:
		case n == "*":
			c.anyHost = true
		default:
			c.hosts[n] = true
		}
	}
	return c
}

// hostAllowed reports whether the server answers to Host header host.
// An empty Host (HTTP/1.0) is no browser's and is answered.
func (c *browserCheck) hostAllowed(host string) bool {
	if c.anyHost || host == "" {
		return true
	}
	name := strings.ToLower(hostName(host))
	if name == "localhost" || c.hosts[name] {
		return true
	}
	_, err := netip.ParseAddr(name)
	return err == nil
}

// hostName strips the port, and an IPv6 address's brackets, from a Host
// header.
func hostName(host string) string {
	if strings.HasPrefix(host, "[") {
		if i := strings.IndexByte(host, ']'); i > 0 {
			return host[1:i]
		}
		return host
	}
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[:i], ":") {
		return host[:i]
	}
	return host
}

// originAllowed reports whether a request from origin may be answered
// with CORS headers allowing it. The caller has checked the request is not
// same-origin.
func (c *browserCheck) originAllowed(origin string) bool {
	return c.anyOrigin || c.origins[strings.ToLower(origin)]
}

// sameOrigin reports whether r comes from a page of the server itself:
// the browser says so (Sec-Fetch-Site, which pages cannot set), or origin
// names the host r was sent to. A rebound host name passes this; the host
// check stops it.
func sameOrigin(r *http.Request, origin string) bool {
	if r.Header.Get("Sec-Fetch-Site") == "same-origin" {
		return true
	}
	scheme, host, ok := strings.Cut(origin, "://")
	if !ok {
		return false // "null": a sandboxed or local page
	}
	if strings.EqualFold(host, r.Host) {
		return true
	}
	// Browsers leave the scheme's default port out of Origin; a client may
	// still write it in Host.
	switch strings.ToLower(scheme) {
	case "http":
		return strings.EqualFold(host+":80", r.Host)
	case "https":
		return strings.EqualFold(host+":443", r.Host)
	}
	return false
}

// The CORS headers of every server: every request header a door reads,
// and every response header one sets, so that a page of an allowed origin
// can do what a client outside a browser can.
var (
	// DELETE ends an MCP session (streamable HTTP).
	corsMethods = strings.Join(append(cors.AllowedMethods(), http.MethodDelete), ", ")
	corsAllowed = strings.Join(append(cors.AllowedHeaders(),
		"Authorization",             // API keys
		RequestIDHeader,             // the caller's own request id
		"Traceparent", "Tracestate", // W3C trace context (see telemetry.Tracing)
		"Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-ID", // MCP's streamable HTTP
	), ", ")
	corsExposed = strings.Join(append(cors.ExposedHeaders(),
		RequestIDHeader,
		"Mcp-Session-Id",
		"Retry-After",      // resource_exhausted on POST /run and Connect
		"WWW-Authenticate", // unauthenticated
	), ", ")
)

// withCORS answers CORS for h. With a nil check every origin is allowed;
// otherwise requests to hosts or from origins the check refuses are
// answered 403 before h sees them.
func (s *Server) withCORS(h http.Handler, check *browserCheck) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if check != nil {
			if origin != "" {
				w.Header().Add("Vary", "Origin")
			}
			if !check.hostAllowed(r.Host) {
				s.refuseBrowser(w, r, fmt.Errorf("host %q is not a name this server answers to", r.Host))
				return
			}
			if origin == "" || sameOrigin(r, origin) {
				h.ServeHTTP(w, r)
				return
			}
			if !check.originAllowed(origin) {
				s.refuseBrowser(w, r, fmt.Errorf("pages of origin %q may not call this server", origin))
				return
			}
		}
		if origin != "" {
			hdr := w.Header()
			hdr.Set("Access-Control-Allow-Origin", origin)
			if check == nil {
				hdr.Add("Vary", "Origin")
			}
			hdr.Set("Access-Control-Expose-Headers", corsExposed)
			if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
				hdr.Set("Access-Control-Allow-Methods", corsMethods)
				hdr.Set("Access-Control-Allow-Headers", corsAllowed)
				hdr.Set("Access-Control-Max-Age", "7200")
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// refuseBrowser answers r 403 for err, in plain HTTP whatever the protocol
// (the request was refused before its protocol mattered), with no CORS
// headers: a page that sent it cannot read the answer.
func (s *Server) refuseBrowser(w http.ResponseWriter, r *http.Request, err error) {
	s.logger.Debug("request refused", "request_id", r.Header.Get(RequestIDHeader), "path", r.URL.Path, "remote", r.RemoteAddr,
		"host", r.Host, "origin", r.Header.Get("Origin"), "error", err)
	writeHTTPError(w, http.StatusForbidden, connect.NewError(connect.CodePermissionDenied, err))
}
