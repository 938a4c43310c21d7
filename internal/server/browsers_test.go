package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	"github.com/codemode-go/codemode/internal/testkit"
)

// countingService counts the calls that reached it.
type countingService struct {
	agentv1connect.UnimplementedAgentServiceHandler
	calls *atomic.Int64
}

func (c countingService) Status(context.Context, *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error) {
	c.calls.Add(1)
	return connect.NewResponse(&agentv1.StatusResponse{Status: &agentv1.AgentStatus{Name: "x"}}), nil
}

type browserServer struct {
	url, addr string
	port      string
	calls     atomic.Int64 // calls that reached a handler, on any path
}

// serveBrowsers serves countingService, plainHandler and a page on
// 127.0.0.1 with b.
func serveBrowsers(t testing.TB, b *Browsers) *browserServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bs := &browserServer{addr: ln.Addr().String(), url: "http://" + ln.Addr().String()}
	_, bs.port, _ = net.SplitHostPort(bs.addr)
	s := New(slog.New(slog.DiscardHandler))
	s.Browsers = b
	s.HandleService(agentv1connect.NewAgentServiceHandler(countingService{calls: &bs.calls}, s.HandlerOptions()...))
	s.Handle("/plain", plainHandler(&bs.calls))
	s.Handle("/page", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		bs.calls.Add(1)
		_, _ = io.WriteString(w, "<!doctype html>")
	}))
	serveOn(t, s, ln)
	return bs
}

// browserRequest is one request as a browser could send it.
type browserRequest struct {
	method, path, contentType, body string
	host                            string // "": the server's address
	header                          map[string]string
}

const statusPath = "/" + agentv1connect.AgentServiceName + "/Status"

// requests are the kinds of request a page can send to the server: a
// Connect JSON call (preflighted), a CORS-simple text/plain POST, a
// preflight, and a GET.
func browserRequests(origin string) map[string]browserRequest {
	o := map[string]string{}
	if origin != "" {
		o["Origin"] = origin
	}
	return map[string]browserRequest{
		"connect json": {method: "POST", path: statusPath, contentType: "application/json", body: "{}", header: o},
		"simple post":  {method: "POST", path: "/plain", contentType: "text/plain", body: "x", header: o},
		"get":          {method: "GET", path: "/page", header: o},
		"preflight": {method: "OPTIONS", path: statusPath, header: merge(o, map[string]string{
			"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})},
	}
}

func merge(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func (bs *browserServer) do(t *testing.T, c *http.Client, br browserRequest) *http.Response {
	t.Helper()
	var body io.Reader
	if br.body != "" {
		body = strings.NewReader(br.body)
	}
	req, err := http.NewRequestWithContext(t.Context(), br.method, bs.url+br.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if br.host != "" {
		req.Host = br.host
	}
	if br.contentType != "" {
		req.Header.Set("Content-Type", br.contentType)
	}
	for k, v := range br.header {
		req.Header.Set(k, v)
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res
}

// corsHeaders lists the CORS allow headers in h.
func corsHeaders(h http.Header) []string {
	var out []string
	for k := range h {
		if strings.HasPrefix(k, "Access-Control-Allow-") {
			out = append(out, k)
		}
	}
	return out
}

// TestBrowsersOrigins checks that a server with Browsers answers its own
// pages, clients without Origin and listed origins, and refuses every
// other origin with 403 and no CORS headers before any handler runs, on
// HTTP/1.1 and h2c.
func TestBrowsersOrigins(t *testing.T) {
	t.Parallel()
	const listed = "http://127.0.0.1:5173"
	for cname, client := range clients {
		t.Run(cname, func(t *testing.T) {
			t.Parallel()
			bs := serveBrowsers(t, &Browsers{Origins: []string{listed, "https://App.Example.com:443/"}})
			self := "http://" + bs.addr
			for _, tc := range []struct {
				name    string
				origin  string
				header  map[string]string
				allowed bool
				cors    bool // answered with CORS allow headers
			}{
				{name: "no origin", allowed: true},
				{name: "own origin", origin: self, allowed: true},
				{name: "own origin by fetch metadata", origin: "https://codemode.example.com", header: map[string]string{"Sec-Fetch-Site": "same-origin"}, allowed: true},
				{name: "listed origin", origin: listed, allowed: true, cors: true},
				{name: "listed origin normalized", origin: "https://app.example.com", allowed: true, cors: true},
				{name: "another loopback port", origin: "http://127.0.0.1:" + bs.port + "1"},
				{name: "localhost of the same port", origin: "http://localhost:" + bs.port},
				{name: "another site", origin: "https://evil.example"},
				{name: "cross-site by fetch metadata", origin: "https://evil.example", header: map[string]string{"Sec-Fetch-Site": "cross-site"}},
				{name: "null origin", origin: "null"},
			} {
				for rname, br := range browserRequests(tc.origin) {
					t.Run(tc.name+"/"+rname, func(t *testing.T) {
						br.header = merge(br.header, tc.header)
						before := bs.calls.Load()
						res := bs.do(t, client(), br)
						reached := bs.calls.Load() > before
						if !tc.allowed {
							if res.StatusCode != http.StatusForbidden || reached || len(corsHeaders(res.Header)) > 0 {
								t.Fatalf("origin %q: got %s, reached a handler: %v, CORS headers %v; want 403, no handler, no CORS headers",
									tc.origin, res.Status, reached, corsHeaders(res.Header))
							}
							if res.Header.Get(RequestIDHeader) == "" {
								t.Errorf("the refusal has no %s", RequestIDHeader)
							}
							return
						}
						if res.StatusCode == http.StatusForbidden {
							t.Fatalf("origin %q refused: %s", tc.origin, res.Status)
						}
						if got := res.Header.Get("Access-Control-Allow-Origin"); tc.cors != (got != "") || (tc.cors && got != tc.origin) {
							t.Fatalf("origin %q: Access-Control-Allow-Origin %q", tc.origin, got)
						}
						if br.method == "OPTIONS" && tc.cors && (res.StatusCode != http.StatusNoContent || res.Header.Get("Access-Control-Allow-Methods") == "") {
							t.Fatalf("preflight of listed origin: %s %v", res.Status, res.Header)
						}
					})
				}
			}
		})
	}
}

// TestBrowsersAnyOrigin checks that "*" allows every origin, and that
// an unset Browsers keeps the servers' old answer: CORS for every origin.
func TestBrowsersAnyOrigin(t *testing.T) {
	t.Parallel()
	for name, b := range map[string]*Browsers{"star": {Origins: []string{"*"}}, "nil": nil} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			bs := serveBrowsers(t, b)
			for rname, br := range browserRequests("https://evil.example") {
				t.Run(rname, func(t *testing.T) {
					res := bs.do(t, http.DefaultClient, br)
					if res.StatusCode == http.StatusForbidden || res.Header.Get("Access-Control-Allow-Origin") != "https://evil.example" {
						t.Fatalf("got %s %v, want the origin allowed", res.Status, res.Header)
					}
				})
			}
		})
	}
}

// TestBrowsersHosts checks that a server with Browsers answers IP
// addresses, localhost and listed names, whatever the port, and refuses
// every other Host (DNS rebinding) with 403 on every kind of request and
// every protocol, with or without a same-origin Origin.
func TestBrowsersHosts(t *testing.T) {
	t.Parallel()
	bs := serveBrowsers(t, &Browsers{Hosts: []string{"codemode.example.com"}})
	for _, tc := range []struct {
		host    string
		allowed bool
	}{
		{host: bs.addr, allowed: true},
		{host: "127.0.0.1", allowed: true},
		{host: "127.1.2.3:8000", allowed: true},
		{host: "localhost:" + bs.port, allowed: true},
		{host: "LOCALHOST:" + bs.port, allowed: true},
		{host: "[::1]:" + bs.port, allowed: true},
		{host: "[0:0:0:0:0:0:0:1]:" + bs.port, allowed: true},
		{host: "codemode.example.com", allowed: true},
		{host: "Codemode.Example.COM:443", allowed: true},
		{host: "evil.example:" + bs.port},
		{host: "localhost.evil.example:" + bs.port},
		{host: "codemode.example.com.evil.example"},
		{host: "localhost.:" + bs.port},
		{host: "foo.localhost:" + bs.port},
	} {
		for _, origin := range []string{"", "http://" + tc.host} {
			for rname, br := range browserRequests(origin) {
				t.Run(tc.host+"/"+origin+"/"+rname, func(t *testing.T) {
					br.host = tc.host
					before := bs.calls.Load()
					res := bs.do(t, testkit.HTTP1Client(), br)
					reached := bs.calls.Load() > before
					if tc.allowed != (res.StatusCode != http.StatusForbidden) {
						t.Fatalf("host %q: %s, want allowed %v", tc.host, res.Status, tc.allowed)
					}
					if !tc.allowed && (reached || len(corsHeaders(res.Header)) > 0) {
						t.Fatalf("host %q refused after a handler ran (%v) or with CORS headers %v", tc.host, reached, corsHeaders(res.Header))
					}
				})
			}
		}
	}
	t.Run("any", func(t *testing.T) {
		all := serveBrowsers(t, &Browsers{Hosts: []string{"*"}})
		res := all.do(t, testkit.HTTP1Client(), browserRequest{method: "GET", path: "/page", host: "evil.example"})
		if res.StatusCode != http.StatusOK {
			t.Fatalf("hosts *: %s", res.Status)
		}
	})
}

// TestBrowsersEveryProtocol checks that Connect, gRPC and gRPC-Web clients
// read a refused Origin or Host as permission_denied, and that the call
// never reached the service.
func TestBrowsersEveryProtocol(t *testing.T) {
	t.Parallel()
	bs := serveBrowsers(t, &Browsers{})
	for _, refusal := range []struct{ name, header, value string }{
		{"origin", "Origin", "https://evil.example"},
		{"host", "Host", "evil.example:" + bs.port},
	} {
		for name, opts := range map[string][]connect.ClientOption{
			"connect": nil, "connect+json": {connect.WithProtoJSON()},
			"grpc": {connect.WithGRPC()}, "grpcweb": {connect.WithGRPCWeb()},
		} {
			t.Run(refusal.name+"/"+name, func(t *testing.T) {
				c := agentv1connect.NewAgentServiceClient(NewClient(), bs.url, opts...)
				req := connect.NewRequest(&agentv1.StatusRequest{})
				if refusal.header == "Host" {
					c = agentv1connect.NewAgentServiceClient(hostClient(refusal.value), bs.url, opts...)
				} else {
					req.Header().Set(refusal.header, refusal.value)
				}
				before := bs.calls.Load()
				_, err := c.Status(t.Context(), req)
				if connect.CodeOf(err) != connect.CodePermissionDenied || bs.calls.Load() != before {
					t.Fatalf("got %v (service reached: %v), want permission_denied before the service", err, bs.calls.Load() != before)
				}
			})
		}
	}
}

// hostClient is an h2c client that sends host as every request's Host.
func hostClient(host string) *http.Client {
	c := NewClient()
	base := c.Transport
	c.Transport = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r = r.Clone(r.Context())
		r.Host = host
		return base.RoundTrip(r)
	})
	return c
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestBrowsersValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		b    Browsers
		fail bool
	}{
		{b: Browsers{}},
		{b: Browsers{Origins: []string{"*", "http://localhost:5173", "https://app.example.com/", "chrome-extension://abcdef"}, Hosts: []string{"*", "codemode.example.com"}}},
		{b: Browsers{Origins: []string{"localhost:5173"}}, fail: true},
		{b: Browsers{Origins: []string{"http://localhost:5173/app"}}, fail: true},
		{b: Browsers{Origins: []string{"http://"}}, fail: true},
		{b: Browsers{Origins: []string{""}}, fail: true},
		{b: Browsers{Hosts: []string{"codemode.example.com:8000"}}, fail: true},
		{b: Browsers{Hosts: []string{"http://codemode.example.com"}}, fail: true},
		{b: Browsers{Hosts: []string{""}}, fail: true},
	} {
		if err := tc.b.Validate(); (err != nil) != tc.fail {
			t.Errorf("%+v: Validate() = %v, want failure %v", tc.b, err, tc.fail)
		}
	}
}

// BenchmarkBrowsers measures the Origin and Host checks alone: the
// handler chain up to a handler that does nothing, with the checks (a
// same-origin request, a listed cross-origin one, one without Origin) and
// without them (Browsers unset, as the internal services run).
//
//	go test -run '^$' -bench Browsers ./internal/server/
func BenchmarkBrowsers(b *testing.B) {
	for _, tc := range []struct {
		name   string
		b      *Browsers
		origin string
	}{
		{name: "unchecked", origin: "http://127.0.0.1:8000"},
		{name: "checked/same-origin", b: &Browsers{}, origin: "http://127.0.0.1:8000"},
		{name: "checked/no-origin", b: &Browsers{}},
		{name: "checked/listed-origin", b: &Browsers{Origins: []string{"http://localhost:5173"}, Hosts: []string{"codemode.example.com"}}, origin: "http://localhost:5173"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := New(slog.New(slog.DiscardHandler))
			s.Browsers = tc.b
			s.Handle("/run", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			h := s.Handler()
			req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8000/run", nil)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(RequestIDHeader, "bench")
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
			}
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
	}
}

// headerWriter is a ResponseWriter that keeps nothing but its header.
type headerWriter struct{ h http.Header }

func (w *headerWriter) Header() http.Header         { return w.h }
func (w *headerWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *headerWriter) WriteHeader(int)             {}

// BenchmarkBrowserCheck measures the checks alone: the handler a request
// reaches, called directly ("handler") and through withCORS, with the
// checks and without them (Browsers unset: the old CORS answer).
//
//	go test -run '^$' -bench BrowserCheck ./internal/server/
func BenchmarkBrowserCheck(b *testing.B) {
	s := New(slog.New(slog.DiscardHandler))
	var reached int
	handler := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached++ })
	listed := Browsers{Origins: []string{"http://localhost:5173"}, Hosts: []string{"codemode.example.com"}}
	for _, tc := range []struct {
		name   string
		h      http.Handler
		host   string
		origin string
	}{
		{name: "handler", h: handler, origin: "http://127.0.0.1:8000"},
		{name: "unchecked", h: s.withCORS(handler, nil), origin: "http://127.0.0.1:8000"},
		{name: "checked/no-origin", h: s.withCORS(handler, Browsers{}.compile())},
		{name: "checked/same-origin", h: s.withCORS(handler, Browsers{}.compile()), origin: "http://127.0.0.1:8000"},
		{name: "checked/named-host", h: s.withCORS(handler, listed.compile()), host: "codemode.example.com", origin: "https://codemode.example.com"},
		{name: "checked/listed-origin", h: s.withCORS(handler, listed.compile()), origin: "http://localhost:5173"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8000/run", nil)
			if tc.host != "" {
				req.Host = tc.host
			}
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
			}
			w := &headerWriter{h: make(http.Header)}
			reached = 0
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				tc.h.ServeHTTP(w, req)
			}
			if reached != b.N {
				b.Fatalf("the handler ran %d times of %d", reached, b.N)
			}
		})
	}
}

// BenchmarkBrowsersCall is BenchmarkServerLimits for the checks: a unary
// Connect call over h2c to a server with Browsers and to one without,
// interleaved, in the same run; the checked calls carry a same-origin
// Origin.
//
//	go test -run '^$' -bench BrowsersCall ./internal/server/
func BenchmarkBrowsersCall(b *testing.B) {
	servers := []struct {
		name string
		bs   *browserServer
		c    agentv1connect.AgentServiceClient
		lat  []time.Duration
	}{{name: "checked", bs: serveBrowsers(b, &Browsers{})}, {name: "unchecked", bs: serveBrowsers(b, nil)}}
	for i := range servers {
		servers[i].c = agentv1connect.NewAgentServiceClient(NewClient(), servers[i].bs.url)
	}
	call := func(i int) time.Duration {
		req := connect.NewRequest(&agentv1.StatusRequest{})
		req.Header().Set("Origin", servers[i].bs.url)
		start := time.Now()
		if _, err := servers[i].c.Status(context.Background(), req); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for range 100 {
		for i := range servers {
			call(i)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for j := range servers {
			k := (i + j) % 2
			servers[k].lat = append(servers[k].lat, call(k))
		}
	}
	b.StopTimer()
	reportP50s(b, [2]string{servers[0].name, servers[1].name}, [2]string{"checked", "unchecked"}, [2][]time.Duration{servers[0].lat, servers[1].lat})
}

// FuzzBrowsers checks, for any Host and Origin header, that a request
// reaches the handler only under a name that cannot be rebound (an IP
// address or localhost) or a listed one, and only from its own origin, no
// origin or a listed one; and that a refusal carries no CORS header.
func FuzzBrowsers(f *testing.F) {
	for _, seed := range [][2]string{
		{"127.0.0.1:8000", "http://127.0.0.1:8000"}, {"127.0.0.1:8000", "http://127.0.0.1:5173"},
		{"localhost:8000", ""}, {"[::1]:8000", "http://[::1]:8000"}, {"evil.example:8000", "http://evil.example:8000"},
		{"codemode.example.com", "https://codemode.example.com"}, {"Codemode.Example.COM:443", "null"},
		{"localhost.:8000", "http://localhost.:8000"}, {"[fe80::1%25eth0]:1", "http://LOCALHOST:5173"}, {"", "x"},
	} {
		f.Add(seed[0], seed[1])
	}
	s := New(slog.New(slog.DiscardHandler))
	listed := Browsers{Origins: []string{"http://localhost:5173"}, Hosts: []string{"codemode.example.com"}}
	var reached bool
	h := s.withCORS(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true }), listed.compile())
	f.Fuzz(func(t *testing.T, host, origin string) {
		req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/run", nil)
		req.Host = host
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		w := httptest.NewRecorder()
		reached = false
		h.ServeHTTP(w, req)
		if !reached {
			if w.Code != http.StatusForbidden || len(corsHeaders(w.Header())) > 0 {
				t.Fatalf("host %q origin %q: refused with %d %v", host, origin, w.Code, w.Header())
			}
			return
		}
		name := strings.ToLower(hostName(host))
		if _, err := netip.ParseAddr(name); err != nil && host != "" && name != "localhost" && name != "codemode.example.com" {
			t.Fatalf("host %q (name %q) was answered", host, name)
		}
		if origin != "" && !sameOrigin(req, origin) && strings.ToLower(origin) != "http://localhost:5173" {
			t.Fatalf("origin %q at host %q was answered", origin, host)
		}
	})
}

// TestBrowsersCORSHeaders checks that a page of an allowed origin may send
// every header a door reads (its own request id among them) and read every
// header one sets: the preflight allows them and the answer exposes them.
func TestBrowsersCORSHeaders(t *testing.T) {
	t.Parallel()
	const origin = "https://app.example"
	bs := serveBrowsers(t, &Browsers{Origins: []string{origin}})
	sent := []string{"authorization", "content-type", "connect-protocol-version", "connect-timeout-ms", "x-grpc-web", "x-user-agent",
		"x-request-id", "traceparent", "tracestate", "mcp-session-id", "mcp-protocol-version", "last-event-id"}
	res := bs.do(t, http.DefaultClient, browserRequest{method: "OPTIONS", path: statusPath, header: map[string]string{
		"Origin": origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": strings.Join(sent, ","),
	}})
	if res.StatusCode != http.StatusNoContent {
		t.Fatalf("preflight: %s", res.Status)
	}
	allowed := strings.Split(strings.ToLower(res.Header.Get("Access-Control-Allow-Headers")), ", ")
	for _, h := range sent {
		if !slices.Contains(allowed, h) {
			t.Errorf("preflight does not allow %s: %v", h, allowed)
		}
	}
	res = bs.do(t, http.DefaultClient, browserRequest{method: "POST", path: statusPath, contentType: "application/json", body: "{}",
		header: map[string]string{"Origin": origin, "X-Request-Id": "page-chosen-id"}})
	if got := res.Header.Get("X-Request-Id"); got != "page-chosen-id" {
		t.Errorf("X-Request-Id %q, want the page's", got)
	}
	exposed := strings.Split(strings.ToLower(res.Header.Get("Access-Control-Expose-Headers")), ", ")
	for _, h := range []string{"x-request-id", "mcp-session-id", "retry-after", "www-authenticate", "grpc-status", "grpc-message"} {
		if !slices.Contains(exposed, h) {
			t.Errorf("%s is not exposed: %v", h, exposed)
		}
	}
}
