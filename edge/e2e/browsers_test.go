package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
	"github.com/codemode-go/codemode/internal/testkit/promtext"
)

// pageRequest is one request a web page could make the browser send to the
// edge: through each door, with the body that would run code.
type pageRequest struct {
	name                            string
	method, path, contentType, body string
	header                          map[string]string
	h2c                             bool // gRPC needs HTTP/2
	// runs: answered for a caller that may, it runs runCode.
	runs bool
	// status for a caller that may (curl); 0: 200.
	status int
}

// frame puts msg in a gRPC / Connect streaming envelope.
func frame(msg []byte) string {
	var b bytes.Buffer
	b.WriteByte(0)
	_ = binary.Write(&b, binary.BigEndian, uint32(len(msg)))
	b.Write(msg)
	return b.String()
}

const (
	executePath = "/" + edgev1connect.ExecutionServiceName + "/Execute"
	// runCode prints ranOutput, which neither it nor an error quoting
	// a request (a port, an origin) contains.
	runCode   = "print('ran' + '-here')"
	ranOutput = "ran-here"
	// mcpInitialize opens an MCP session.
	mcpInitialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`
)

// pageRequests are the requests of pageRequest on every door of the edge;
// mcpSession is an MCP session of /mcp opened by a caller that may.
func pageRequests(mcpSession string) []pageRequest {
	pb, _ := proto.Marshal(&edgev1.ExecuteRequest{Language: "python", Code: runCode})
	json := `{"language":"python","code":"` + runCode + `"}`
	mcpAccept := map[string]string{"Accept": "application/json, text/event-stream"}
	return []pageRequest{
		{name: "connect json", method: "POST", path: executePath, contentType: "application/json", body: json, runs: true},
		{name: "connect stream", method: "POST", path: "/" + edgev1connect.ExecutionServiceName + "/ExecuteStream",
			contentType: "application/connect+json", body: frame([]byte(json)), runs: true},
		{name: "grpc", method: "POST", path: executePath, contentType: "application/grpc", body: frame(pb),
			header: map[string]string{"Te": "trailers"}, h2c: true, runs: true},
		{name: "grpc-web", method: "POST", path: executePath, contentType: "application/grpc-web+proto", body: frame(pb),
			header: map[string]string{"X-Grpc-Web": "1"}, runs: true},
		{name: "run json", method: "POST", path: "/run", contentType: "application/json", body: `{"code":"` + runCode + `"}`, runs: true},
		{name: "run text/plain", method: "POST", path: "/run", contentType: "text/plain;charset=UTF-8", body: `{"code":"` + runCode + `"}`,
			status: http.StatusUnsupportedMediaType},
		{name: "mcp initialize", method: "POST", path: "/mcp", contentType: "application/json", body: mcpInitialize, header: mcpAccept},
		{name: "mcp execute_code", method: "POST", path: "/mcp", contentType: "application/json",
			body:   `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"execute_code","arguments":{"language":"python","code":"` + runCode + `"}}}`,
			header: map[string]string{"Accept": mcpAccept["Accept"], "Mcp-Session-Id": mcpSession, "Mcp-Protocol-Version": "2025-06-18"}, runs: true},
		{name: "mcp-no-code-execute initialize", method: "POST", path: "/mcp-no-code-execute", contentType: "application/json", body: mcpInitialize, header: mcpAccept},
		{name: "no-code/mcp initialize", method: "POST", path: "/no-code/mcp", contentType: "application/json", body: mcpInitialize, header: mcpAccept},
		{name: "status", method: "GET", path: "/status"},
		{name: "page", method: "GET", path: "/"},
		{name: "preflight", method: "OPTIONS", path: executePath,
			header: map[string]string{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}, status: http.StatusNoContent},
	}
}

// send sends pr to the edge at addr with Host host ("": addr) and Origin
// origin ("": none), and returns the answer with its body read.
func (pr pageRequest) send(t *testing.T, addr, host, origin string) (*http.Response, string) {
	t.Helper()
	var body io.Reader
	if pr.body != "" {
		body = strings.NewReader(pr.body)
	}
	req, err := http.NewRequestWithContext(t.Context(), pr.method, "http://"+addr+pr.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	if pr.contentType != "" {
		req.Header.Set("Content-Type", pr.contentType)
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	for k, v := range pr.header {
		req.Header.Set(k, v)
	}
	c := testkit.HTTP1Client()
	if pr.h2c {
		c = server.NewClient()
	}
	c.Timeout = time.Minute
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", pr.name, err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

// executions is the number of executions the edge p has ended, on every
// door: it counts each one that reached the execution service, run or not.
func executions(t *testing.T, p *Process) float64 {
	t.Helper()
	return promtext.Sample(scrape(t, p), "codemode_executions_total", nil)
}

// openMCPSession opens a session of /mcp at the edge's url as a caller
// without Origin does.
func openMCPSession(t *testing.T, url string) string {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/mcp", strings.NewReader(mcpInitialize))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	id := res.Header.Get("Mcp-Session-Id")
	if res.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("initialize: %s, session %q", res.Status, id)
	}
	if status, rpcErr, raw := rpcPost(t, url+"/mcp", id, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); status >= 300 || rpcErr != nil {
		t.Fatalf("initialized: %d %v %s", status, rpcErr, raw)
	}
	return id
}

// TestPagesOfOtherOriginsCannotUseTheEdge sends, on every door of an edge
// without API keys, what a web page of another origin, or one whose host
// name was rebound to the edge's address (DNS rebinding), makes the
// browser send. Each is refused with 403 and no CORS header, and no
// execution reaches the edge's execution service (its metrics count none).
// The same requests from a caller without Origin (curl), from the edge's
// own pages, and to localhost run as before, which also shows that the
// metrics see runs. An edge with --allowed-origins answers that origin, and
// one with --allowed-hosts that name, on every door.
func TestPagesOfOtherOriginsCannotUseTheEdge(t *testing.T) {
	t.Parallel()
	s := shared(t)
	edge, err := s.StartEdge([]string{"METRICS_ADDR=127.0.0.1:0"})
	if err != nil {
		t.Fatalf("start edge: %v", err)
	}
	t.Cleanup(func() { _ = edge.Stop(30 * time.Second) })
	_, port, _ := net.SplitHostPort(edge.Addr)
	// Another loopback port: a page a developer's dev server, or anything
	// else on the machine, serves.
	otherOrigin := "http://127.0.0.1:" + fmt.Sprint(freeLoopbackPort(t))
	rebound := "rebind.example:" + port
	session := openMCPSession(t, edge.URL())
	bc := &browsersCase{s: s, edge: edge, port: port, otherOrigin: otherOrigin, rebound: rebound, requests: pageRequests(session)}
	bc.othersAreRefused(t)
	bc.ownAreServed(t)
	t.Run("allowed origin", bc.allowedOrigin)
	t.Run("allowed host", bc.allowedHost)
	t.Run("with API keys", bc.withAPIKeys)
}

// browsersCase is TestPagesOfOtherOriginsCannotUseTheEdge's edge, the
// origins and host it is called from, and the requests a page sends.
type browsersCase struct {
	s           *Stack
	edge        *Process
	port        string // the edge's
	otherOrigin string // another loopback port's
	rebound     string // a name rebound to the edge's address, with its port
	requests    []pageRequest
}

// othersAreRefused checks, in a subtest each, that pages of other origins
// and hosts are refused without running anything.
func (bc *browsersCase) othersAreRefused(t *testing.T) {
	for _, attack := range []struct{ name, host, origin string }{
		{name: "other origin", origin: bc.otherOrigin},
		{name: "other site", origin: "https://evil.example"},
		{name: "null origin", origin: "null"},
		{name: "rebound host", host: bc.rebound, origin: "http://" + bc.rebound},
		{name: "rebound host without origin", host: bc.rebound},
	} {
		t.Run(attack.name, func(t *testing.T) {
			before := executions(t, bc.edge)
			for _, pr := range bc.requests {
				res, body := pr.send(t, bc.edge.Addr, attack.host, attack.origin)
				if res.StatusCode != http.StatusForbidden {
					t.Errorf("%s: HTTP %s, want 403\n%.300s", pr.name, res.Status, body)
				}
				for k := range res.Header {
					if strings.HasPrefix(k, "Access-Control-Allow-") {
						t.Errorf("%s: refused with CORS header %s: %v", pr.name, k, res.Header[k])
					}
				}
				if strings.Contains(body, ranOutput) {
					t.Errorf("%s: the answer carries the program's output: %.300s", pr.name, body)
				}
			}
			if after := executions(t, bc.edge); after != before {
				t.Fatalf("%d executions reached the edge's execution service, want none\n%s", int(after-before), bc.edge.Logs())
			}
		})
	}

}

// ownAreServed checks, in a subtest each, that calls without an origin, of
// the edge's own origin and of localhost are served.
func (bc *browsersCase) ownAreServed(t *testing.T) {
	for _, caller := range []struct{ name, host, origin string }{
		{name: "no origin"},
		{name: "own origin", origin: bc.edge.URL()},
		{name: "localhost", host: "localhost:" + bc.port, origin: "http://localhost:" + bc.port},
	} {
		t.Run(caller.name, func(t *testing.T) {
			before, runs := executions(t, bc.edge), 0
			for _, pr := range bc.requests {
				if pr.method == "OPTIONS" {
					continue // neither curl nor a page of the edge sends preflights
				}
				res, body := pr.send(t, bc.edge.Addr, caller.host, caller.origin)
				want := pr.status
				if want == 0 {
					want = http.StatusOK
				}
				if res.StatusCode != want {
					t.Errorf("%s: HTTP %s, want %d\n%.300s", pr.name, res.Status, want, body)
				}
				if pr.runs {
					runs++
					if !strings.Contains(body, ranOutput) {
						t.Errorf("%s: no output in the answer: %.300s", pr.name, body)
					}
				}
			}
			// A stream's execution is counted just after its last message.
			want, after := before+float64(runs), executions(t, bc.edge)
			testkit.Until(10*time.Second, func() bool {
				after = executions(t, bc.edge)
				return after >= want
			})
			if after != want {
				t.Fatalf("%d executions ended, want %d", int(after-before), runs)
			}
		})
	}
}

// allowedOrigin checks --allowed-origins: the listed origins are served,
// and the list allows no host name.
func (bc *browsersCase) allowedOrigin(t *testing.T) {
	allowing, err := bc.s.StartEdge(nil, "--allowed-origins", "https://evil.example,"+bc.otherOrigin)
	if err != nil {
		t.Fatalf("start edge: %v", err)
	}
	t.Cleanup(func() { _ = allowing.Stop(30 * time.Second) })
	for _, pr := range pageRequests(openMCPSession(t, allowing.URL())) {
		res, body := pr.send(t, allowing.Addr, "", bc.otherOrigin)
		want := pr.status
		if want == 0 {
			want = http.StatusOK
		}
		if res.StatusCode != want || res.Header.Get("Access-Control-Allow-Origin") != bc.otherOrigin {
			t.Errorf("%s: HTTP %s, Access-Control-Allow-Origin %q, want %d and %s\n%.300s",
				pr.name, res.Status, res.Header.Get("Access-Control-Allow-Origin"), want, bc.otherOrigin, body)
		}
		if pr.runs && !strings.Contains(body, ranOutput) {
			t.Errorf("%s: no output in the answer: %.300s", pr.name, body)
		}
	}
	// The list allows origins, not host names.
	if res, _ := pageRequests("")[0].send(t, allowing.Addr, bc.rebound, "http://"+bc.rebound); res.StatusCode != http.StatusForbidden {
		t.Errorf("rebound host with --allowed-origins: HTTP %s, want 403", res.Status)
	}
}

// allowedHost checks --allowed-hosts: every door answers a listed name.
func (bc *browsersCase) allowedHost(t *testing.T) {
	named, err := bc.s.StartEdge(nil, "--allowed-hosts", "codemode.test")
	if err != nil {
		t.Fatalf("start edge: %v", err)
	}
	t.Cleanup(func() { _ = named.Stop(30 * time.Second) })
	_, namedPort, _ := net.SplitHostPort(named.Addr)
	host := "codemode.test:" + namedPort
	// As behind a proxy on the same host that passes the Host header on:
	// every door answers the name, MCP included.
	session := openMCPSession(t, named.URL())
	for _, pr := range pageRequests(session) {
		if pr.method == "OPTIONS" {
			continue
		}
		res, body := pr.send(t, named.Addr, host, "http://"+host)
		want := pr.status
		if want == 0 {
			want = http.StatusOK
		}
		if res.StatusCode != want {
			t.Errorf("%s at %s: HTTP %s, want %d\n%.300s", pr.name, host, res.Status, want, body)
		}
		if pr.runs && !strings.Contains(body, ranOutput) {
			t.Errorf("%s: no output in the answer: %.300s", pr.name, body)
		}
	}
	if res, _ := pageRequests("")[0].send(t, named.Addr, bc.rebound, ""); res.StatusCode != http.StatusForbidden {
		t.Errorf("an unlisted name with --allowed-hosts: HTTP %s, want 403", res.Status)
	}
}

// withAPIKeys checks an edge with API keys: any origin and host with a
// key, unless a list says otherwise.
func (bc *browsersCase) withAPIKeys(t *testing.T) {
	// Any origin and host name may call, since only a key runs code and
	// a browser never sends one on its own; a list still applies.
	keyed := hostileEdge(t, bc.s)
	listed := hostileEdge(t, bc.s, "--allowed-origins", bc.otherOrigin, "--allowed-hosts", "codemode.test")
	run := pageRequests("")[4] // run json
	if run.path != "/run" {
		t.Fatalf("request 4 is %s", run.name)
	}
	_, keyedPort, _ := net.SplitHostPort(keyed.Addr)
	_, listedPort, _ := net.SplitHostPort(listed.Addr)
	for _, tc := range []struct {
		name, addr, host, origin, key string
		status                        int
	}{
		{name: "other site without key", addr: keyed.Addr, origin: "https://evil.example", status: http.StatusUnauthorized},
		{name: "other site with key", addr: keyed.Addr, origin: "https://evil.example", key: hostileKeyAlpha, status: http.StatusOK},
		{name: "any host with key", addr: keyed.Addr, host: "rebind.example:" + keyedPort, key: hostileKeyAlpha, status: http.StatusOK},
		{name: "listed origin with key", addr: listed.Addr, origin: bc.otherOrigin, key: hostileKeyAlpha, status: http.StatusOK},
		{name: "unlisted origin with key", addr: listed.Addr, origin: "https://evil.example", key: hostileKeyAlpha, status: http.StatusForbidden},
		{name: "listed host with key", addr: listed.Addr, host: "codemode.test:" + listedPort, key: hostileKeyAlpha, status: http.StatusOK},
		{name: "unlisted host with key", addr: listed.Addr, host: "rebind.example:" + listedPort, key: hostileKeyAlpha, status: http.StatusForbidden},
	} {
		pr := run
		if tc.key != "" {
			pr.header = map[string]string{"Authorization": "Bearer " + tc.key}
		}
		res, body := pr.send(t, tc.addr, tc.host, tc.origin)
		if res.StatusCode != tc.status {
			t.Errorf("%s: HTTP %s, want %d\n%.300s", tc.name, res.Status, tc.status, body)
		}
		if tc.status == http.StatusOK && !strings.Contains(body, ranOutput) {
			t.Errorf("%s: no output in the answer: %.300s", tc.name, body)
		}
	}
}

// BenchmarkBrowserChecks measures what the Origin and Host checks add to a
// run: print(1) over Connect through an edge without keys, sent with the
// edge's own Origin (both checks look the request up), and through one that
// allows every host, sent without Origin (both checks pass at once), in
// front of the same control plane and agent, interleaved in the same run.
// What the checks alone cost is in BenchmarkBrowsers (internal/server).
//
//	go test -run '^$' -bench BrowserChecks -benchtime 100x ./edge/e2e/
func BenchmarkBrowserChecks(b *testing.B) {
	dockertest.Need(b)
	s, err := StartStack("e2e-bench-browsers", "--min-active", "4")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Stop)
	open, err := s.StartEdge(nil, "--allowed-hosts", "*")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = open.Stop(30 * time.Second) })
	runOnce := func(url, origin string) func() {
		c := edgev1connect.NewExecutionServiceClient(server.NewClient(), url)
		return func() {
			req := connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"})
			if origin != "" {
				req.Header().Set("Origin", origin)
			}
			res, err := c.Execute(context.Background(), req)
			if err != nil || res.Msg.GetResult().GetStdout() != "1\n" {
				b.Fatalf("run: %v %v", res, err)
			}
		}
	}
	pairedLatency(b, pair{"checked", runOnce(s.Edge.URL(), s.Edge.URL())}, pair{"open", runOnce(open.URL(), "")})
}

// TestPagesCannotUseTheInternalServices checks that the control plane and
// the agent, which serve no page, refuse every web page (403 before the
// secret is even checked), and that a control plane without a secret also
// refuses a rebound host name, as the edge does.
func TestPagesCannotUseTheInternalServices(t *testing.T) {
	t.Parallel()
	s := shared(t)
	open, err := start("controlplane", withoutSecret(nil), "--addr", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("start control plane without a secret: %v", err)
	}
	t.Cleanup(func() { _ = open.Stop(30 * time.Second) })
	_, openPort, _ := net.SplitHostPort(open.Addr)
	page := "http://127.0.0.1:" + fmt.Sprint(freeLoopbackPort(t))
	run := pageRequest{name: "run text/plain", method: "POST", path: "/run", contentType: "text/plain", body: `{"code":"` + runCode + `"}`}
	for _, tc := range []struct {
		name, addr, host, origin string
		refused                  bool
	}{
		{name: "control plane, a page", addr: s.ControlPlane.Addr, origin: page, refused: true},
		{name: "agent, a page", addr: s.Agent.Addr, origin: page, refused: true},
		{name: "control plane without a secret, a page", addr: open.Addr, origin: page, refused: true},
		{name: "control plane without a secret, a rebound name", addr: open.Addr, host: "rebind.example:" + openPort, refused: true},
		{name: "control plane without a secret, curl", addr: open.Addr},
	} {
		res, body := run.send(t, tc.addr, tc.host, tc.origin)
		if tc.refused != (res.StatusCode == http.StatusForbidden) || strings.Contains(body, ranOutput) {
			t.Errorf("%s: HTTP %s, want refused %v\n%.300s", tc.name, res.Status, tc.refused, body)
		}
	}
}
