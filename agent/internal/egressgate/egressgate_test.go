package egressgate

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/codemode-go/codemode/agent/internal/wire"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	"github.com/codemode-go/codemode/internal/apicatalog"
	"github.com/codemode-go/codemode/internal/testkit/apistest"
	"google.golang.org/protobuf/proto"
)

func TestSpecialAddresses(t *testing.T) {
	// Addresses to classify only: nothing here is dialed.
	v4 := func(a, b, c, d byte) netip.Addr { return netip.AddrFrom4([4]byte{a, b, c, d}) }
	v6 := func(first, second uint16, last byte) netip.Addr {
		var b [16]byte
		b[0], b[1], b[2], b[3], b[15] = byte(first>>8), byte(first), byte(second>>8), byte(second), last
		return netip.AddrFrom16(b)
	}
	for _, tt := range []struct {
		addr netip.Addr
		want string
	}{
		{v4(127, 0, 0, 1), "loopback"}, {netip.IPv6Loopback(), "loopback"},
		{v4(10, 1, 2, 3), "private"}, {v4(172, 16, 0, 1), "private"}, {v4(192, 168, 1, 1), "private"},
		{v6(0xfd00, 0, 1), "private"}, {v6(0xfd00, 0x0ec2, 0x54), "private"},
		{v4(169, 254, 169, 254), "link-local"}, {v6(0xfe80, 0, 1), "link-local"}, {v4(224, 0, 0, 1), "link-local"},
		{v4(0, 0, 0, 0), "unspecified"}, {v4(100, 64, 0, 1), "reserved"}, {v4(192, 0, 2, 1), "reserved"},
		{v4(239, 1, 1, 1), "multicast"}, {v4(8, 8, 8, 8), ""}, {v6(0x2606, 0x4700, 1), ""},
	} {
		if got := special(tt.addr); got != tt.want {
			t.Errorf("special(%s) = %q, want %q", tt.addr, got, tt.want)
		}
	}
}

// pipe returns the two ends of one tunnel, connected back to back.
func pipe(t *testing.T) (program, agent *wire.Tunnel) {
	program, agent = newPipe()
	t.Cleanup(func() { program.Close(); agent.Close() })
	return program, agent
}

// newPipe is pipe for a caller that closes the ends itself.
func newPipe() (program, agent *wire.Tunnel) {
	var a, b *wire.Tunnels
	a = wire.NewTunnels(func(d *runnerv1.EgressData) error { b.Deliver(proto.CloneOf(d)); return nil }, func(c *runnerv1.EgressClose) error { b.Closed(c); return nil })
	b = wire.NewTunnels(func(d *runnerv1.EgressData) error { a.Deliver(proto.CloneOf(d)); return nil }, func(c *runnerv1.EgressClose) error { a.Closed(c); return nil })
	program, _ = a.Open(1, wire.EgressAddr{Host: "program"}, wire.EgressAddr{Host: "agent"})
	agent, _ = b.Open(1, wire.EgressAddr{Host: "agent"}, wire.EgressAddr{Host: "program"})
	return program, agent
}

// get sends a GET for path with host over a new connection of run to
// host:port and returns the response.
func get(t *testing.T, run *Run, host string, port uint32, path string, header http.Header) (*http.Response, error) {
	t.Helper()
	serve, err := run.Open(t.Context(), host, port)
	if err != nil {
		return nil, err
	}
	program, agent := pipe(t)
	go serve(agent)
	req, _ := http.NewRequest("GET", "http://"+host+path, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	if err := req.Write(program); err != nil {
		return nil, err
	}
	res, err := http.ReadResponse(bufio.NewReader(program), req)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	res.Body = io.NopCloser(strings.NewReader(string(b)))
	return res, err
}

func body(res *http.Response) string {
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

func refusal(t *testing.T, err error) *wire.EgressRefusal {
	t.Helper()
	var r *wire.EgressRefusal
	if !errors.As(err, &r) {
		t.Fatalf("got %v, want a refusal", err)
	}
	return r
}

func TestOpen(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s", r.Host, r.URL.Path)
	}))
	defer srv.Close()
	ap := netip.MustParseAddrPort(srv.Listener.Addr().String())
	port := uint32(ap.Port())
	g := New(Config{
		Hosts: map[string][]netip.Addr{"plain.test": {ap.Addr()}, "cluster.test": {ap.Addr()}},
		LookupNetIP: func(ctx context.Context, network, host string) ([]netip.Addr, error) {
			return nil, fmt.Errorf("no DNS in this test: %s", host)
		},
	})
	rules := func(rs ...*executionv1.EgressRule) *executionv1.Egress { return &executionv1.Egress{Allow: rs} }
	rule := func(host string, ports ...uint32) *executionv1.EgressRule {
		return &executionv1.EgressRule{Host: host, Ports: ports}
	}

	t.Run("no rules", func(t *testing.T) {
		run := g.Begin(nil, "t", "r")
		_, err := get(t, run, "plain.test", port, "/", nil)
		if r := refusal(t, err); r.Status != 403 || !strings.Contains(r.Reason, "egress allowlist is empty") {
			t.Errorf("got %+v", r)
		}
		if rep := run.Report(); rep.GetRefused() != 1 || rep.GetRefusals()[0].GetHost() != "plain.test" {
			t.Errorf("report %v", rep)
		}
	})
	t.Run("name without its address", func(t *testing.T) {
		run := g.Begin(rules(rule("plain.test", port)), "t", "r")
		_, err := get(t, run, "plain.test", port, "/", nil)
		want := "plain.test resolves to 127.0.0.1, a loopback address, which only an address rule allows"
		if r := refusal(t, err); r.Status != 403 || r.Reason != want {
			t.Errorf("got %+v, want %q", r, want)
		}
	})
	t.Run("address without the name", func(t *testing.T) {
		run := g.Begin(rules(rule("127.0.0.1", port)), "t", "r")
		_, err := get(t, run, "plain.test", port, "/", nil)
		if r := refusal(t, err); r.Status != 403 || !strings.Contains(r.Reason, "not in this run's egress allowlist") {
			t.Errorf("got %+v", r)
		}
	})
	t.Run("name and address", func(t *testing.T) {
		run := g.Begin(rules(rule("plain.test", port), rule("127.0.0.1", port)), "t", "r")
		res, err := get(t, run, "plain.test", port, "/hi", nil)
		if err != nil || body(res) != "plain.test /hi" {
			t.Fatalf("got %v, %v", res, err)
		}
		rep := run.Report()
		if rep.GetConnections() != 1 || rep.GetBytesSent() == 0 || rep.GetBytesReceived() == 0 {
			t.Errorf("report %v", rep)
		}
	})
	t.Run("other port", func(t *testing.T) {
		run := g.Begin(rules(rule("plain.test", port), rule("127.0.0.1", port)), "t", "r")
		_, err := get(t, run, "plain.test", port+1, "/", nil)
		refusal(t, err)
	})
	t.Run("denied address", func(t *testing.T) {
		g := New(Config{Hosts: map[string][]netip.Addr{"cluster.test": {ap.Addr()}}, Deny: []netip.AddrPort{netip.AddrPortFrom(netip.IPv6Unspecified(), ap.Port())}})
		run := g.Begin(rules(rule("cluster.test", port), rule("127.0.0.0/8", port)), "t", "r")
		_, err := get(t, run, "cluster.test", port, "/", nil)
		if r := refusal(t, err); !strings.Contains(r.Reason, "an address of the cluster itself") {
			t.Errorf("got %+v", r)
		}
	})
	t.Run("connection limit", func(t *testing.T) {
		e := rules(rule("127.0.0.1", port))
		connectionLimit(t, g, e, port)
	})
	t.Run("limits cannot pass the agent's", func(t *testing.T) {
		agentLimitsBound(t)
	})
}

// connectionLimit is TestOpen's "connection limit": a run allowed two
// connections is refused the third with 429, and its report says which limit it reached.
func connectionLimit(t *testing.T, g *Gate, e *executionv1.Egress, port uint32) {
	e.Limits = &executionv1.EgressLimits{Connections: 2}
	run := g.Begin(e, "t", "r")
	for i := range 3 {
		_, err := get(t, run, "127.0.0.1", port, "/", nil)
		if i < 2 && err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			if r := refusal(t, err); r.Status != 429 {
				t.Errorf("got %+v", r)
			}
		}
	}
	if rep := run.Report(); rep.GetLimitReached() != executionv1.EgressLimit_EGRESS_LIMIT_CONNECTIONS || rep.GetConnections() != 2 {
		t.Errorf("report %v", rep)
	}
}

// agentLimitsBound is TestOpen's "limits cannot pass the agent's": a run's
// limits are the agent's defaults when it sets none, and at most the agent's maximum.
func agentLimitsBound(t *testing.T) {
	g := New(Config{Defaults: Limits{Connections: 4, Bytes: 1000}, Max: Limits{Connections: 8, Bytes: 2000}})
	got := g.limits(&executionv1.EgressLimits{Connections: 100, Bytes: 1 << 40})
	if got.Connections != 8 || got.Bytes != 2000 {
		t.Errorf("got %+v", got)
	}
	if got := g.limits(nil); got.Connections != 4 || got.Bytes != 1000 {
		t.Errorf("defaults: got %+v", got)
	}
}

func TestAPIForwarding(t *testing.T) {
	const secret = "s3cr3t-token-value"
	var seen http.Header
	var seenPath string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, seenPath = r.Header.Clone(), r.URL.RequestURI()
		if r.URL.Path == "/v1/echo" {
			// An API that echoes what it was sent, in a header and in a
			// long body with the secret across read boundaries.
			w.Header().Set("X-Echo", r.Header.Get("Authorization"))
			for i := range 5000 {
				fmt.Fprintf(w, "%d %s ", i, r.Header.Get("Authorization"))
			}
			return
		}
		fmt.Fprint(w, `{"login":"octo"}`)
	}))
	defer upstream.Close()
	decl := fmt.Sprintf(`{"apis": [{"name": "fake", "description": "a fake", "base_url": %q,
		"credential": {"header": "Authorization", "prefix": "Bearer ", "secret_env": "FAKE_TOKEN"},
		"tools": []}]}`, upstream.URL+"/v1")
	catalog, err := apicatalog.Parse([]byte(decl), apicatalog.WithGetenv(func(k string) string {
		if k == "FAKE_TOKEN" {
			return secret
		}
		return ""
	}))
	if err != nil {
		t.Fatal(err)
	}
	g := New(Config{APIs: catalog})
	defer g.Close()
	run := g.Begin(&executionv1.Egress{Allow: []*executionv1.EgressRule{{Host: "*.api.codemode"}}}, "t", "r")

	// The program's own Authorization and Host do not reach the API.
	res, err := get(t, run, "fake.api.codemode", 80, "/users/octo?x=1", http.Header{"Authorization": {"Bearer mine"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := body(res); got != `{"login":"octo"}` {
		t.Errorf("body %q", got)
	}
	if seen.Get("Authorization") != "Bearer "+secret || seenPath != "/v1/users/octo?x=1" {
		t.Errorf("the API saw Authorization %q, path %q", seen.Get("Authorization"), seenPath)
	}

	res, err = get(t, run, "fake.api.codemode", 80, "/echo", nil)
	if err != nil {
		t.Fatal(err)
	}
	b := body(res)
	if strings.Contains(b, secret) || strings.Contains(res.Header.Get("X-Echo"), secret) {
		t.Errorf("the echo carries the secret")
	}
	if n := strings.Count(b, "Bearer "+apicatalog.Redacted); n != 5000 || !strings.HasPrefix(res.Header.Get("X-Echo"), "Bearer "+apicatalog.Redacted) {
		t.Errorf("%d redactions in the body, header %q; want 5000 and the header redacted", n, res.Header.Get("X-Echo"))
	}

	res, err = get(t, run, "fake.api.codemode", 80, "/%2e%2e/other", nil)
	if err != nil || res.StatusCode != http.StatusBadRequest || seenPath == "/other" {
		t.Errorf("a path with dot segments: %v, %v; the API saw %q", res.Status, err, seenPath)
	}
	_, err = get(t, run, "fake.api.codemode", 443, "/", nil)
	if r := refusal(t, err); !strings.Contains(r.Reason, "use http://fake.api.codemode/") {
		t.Errorf("port 443: got %+v", r)
	}
	_, err = get(t, run, "other.api.codemode", 80, "/", nil)
	if r := refusal(t, err); r.Status != 404 {
		t.Errorf("unknown API: got %+v", r)
	}
	run = g.Begin(&executionv1.Egress{Allow: []*executionv1.EgressRule{{Host: "other.api.codemode"}}}, "t", "r")
	_, err = get(t, run, "fake.api.codemode", 80, "/", nil)
	refusal(t, err)
}

func TestByteLimit(t *testing.T) {
	big := strings.Repeat("x", 100_000)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, big) }))
	defer srv.Close()
	ap := netip.MustParseAddrPort(srv.Listener.Addr().String())
	g := New(Config{})
	run := g.Begin(&executionv1.Egress{
		Allow:  []*executionv1.EgressRule{{Host: "127.0.0.1", Ports: []uint32{uint32(ap.Port())}}},
		Limits: &executionv1.EgressLimits{Bytes: 10_000},
	}, "t", "r")
	res, err := get(t, run, "127.0.0.1", uint32(ap.Port()), "/", nil)
	if err == nil && len(body(res)) == len(big) {
		t.Fatal("the whole body came through")
	}
	rep := run.Report()
	if rep.GetLimitReached() != executionv1.EgressLimit_EGRESS_LIMIT_BYTES || rep.GetBytesReceived() > 10_000 {
		t.Errorf("report %v", rep)
	}
	_, err = get(t, run, "127.0.0.1", uint32(ap.Port()), "/", nil)
	if r := refusal(t, err); r.Status != 429 {
		t.Errorf("after the limit: got %+v", r)
	}
}

// exchange sends a GET for path with header to the API host over a new
// connection of run and returns everything the program receives, with the
// answers read from it: informational ones first, then the final one, its
// body read (and decoded when it says gzip) and its trailers.
func exchange(t *testing.T, run *Run, host, path string, header http.Header) (raw []byte, answers []*http.Response, body string) {
	t.Helper()
	serve, err := run.Open(t.Context(), host, 80)
	if err != nil {
		t.Fatal(err)
	}
	program, agent := pipe(t)
	go serve(agent)
	req, _ := http.NewRequest("GET", "http://"+host+path, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	req.Close = true
	if err := req.Write(program); err != nil {
		t.Fatal(err)
	}
	raw, _ = io.ReadAll(program)
	br := bufio.NewReader(bytes.NewReader(raw))
	for {
		res, err := http.ReadResponse(br, req)
		if err != nil {
			t.Fatalf("read the answer: %v\n%s", err, raw)
		}
		answers = append(answers, res)
		if res.StatusCode >= 200 {
			var r io.Reader = res.Body
			if res.Header.Get("Content-Encoding") == "gzip" {
				if r, err = gzip.NewReader(res.Body); err != nil {
					t.Fatal(err)
				}
			}
			b, _ := io.ReadAll(r)
			return raw, answers, string(b)
		}
	}
}

// TestAPIEchoForms has a program call an API that echoes its credential in
// every form apistest.Echo writes, asking for what would let one through
// (gzip, ranges), and checks that nothing the program receives holds the
// credential in any form: status lines, headers, bodies decoded, trailers,
// informational answers; and that an API declared with refuse_echo answers
// 502 instead.
func TestAPIEchoForms(t *testing.T) {
	const token = "ghp_echo/0123+456789abcdefghijklmnopqrst"
	echo := apistest.NewEcho(t, "Authorization")
	decl := fmt.Sprintf(`{"apis": [
		{"name": "echo", "base_url": %[1]q, "credential": {"header": "Authorization", "prefix": "Bearer ", "secret_env": "T"}},
		{"name": "strict", "base_url": %[1]q, "credential": {"header": "Authorization", "prefix": "Bearer ", "secret_env": "T", "refuse_echo": true}}]}`, echo.URL)
	catalog, err := apicatalog.Parse([]byte(decl), apicatalog.WithGetenv(func(string) string { return token }))
	if err != nil {
		t.Fatal(err)
	}
	g := New(Config{APIs: catalog})
	defer g.Close()
	run := g.Begin(&executionv1.Egress{Allow: []*executionv1.EgressRule{{Host: "*.api.codemode"}}}, "t", "r")
	find := apicatalog.NewRedactor([]byte(token), false)
	leaks := func(t *testing.T, what string, raw []byte, answers []*http.Response, body string) {
		t.Helper()
		all := append(bytes.Clone(raw), body...)
		for _, res := range answers {
			all = append(all, res.Status...)
			for k, vs := range res.Header {
				all = append(all, k+": "+strings.Join(vs, ", ")+"\n"...)
			}
			for k, vs := range res.Trailer {
				all = append(all, k+": "+strings.Join(vs, ", ")+"\n"...)
			}
		}
		if find.Found(all) || strings.Contains(string(all), "456789abcdefghijklmnopqrst") {
			t.Errorf("%s: the program got the token:\n%s", what, all)
		}
	}
	ask := http.Header{"Accept-Encoding": {"gzip"}, "Te": {"trailers"}}
	for _, form := range apistest.EchoForms {
		t.Run(form, func(t *testing.T) {
			raw, answers, b := exchange(t, run, "echo.api.codemode", "/"+form, ask)
			leaks(t, form, raw, answers, b)
			if last := answers[len(answers)-1]; len(answers) != 1 || last.Header.Get("Content-Encoding") != "" {
				t.Errorf("%d answers, the last %s %v", len(answers), last.Status, last.Header)
			}
			raw, answers, b = exchange(t, run, "strict.api.codemode", "/"+form, ask)
			last := answers[len(answers)-1]
			switch form {
			case "trailer", "early": // dropped: nothing left to refuse
				leaks(t, "strict "+form, raw, answers, b)
			default:
				if last.StatusCode != http.StatusBadGateway || !strings.Contains(b, "codemode egress: strict: the answer echoes the API's credential and is withheld") {
					t.Errorf("strict: %s %q, want 502", last.Status, b)
				}
			}
		})
	}
	t.Run("ranges joined", func(t *testing.T) {
		var joined string
		for _, r := range []string{"bytes=0-19", "bytes=20-39", "bytes=40-"} {
			raw, answers, b := exchange(t, run, "echo.api.codemode", "/range", http.Header{"Range": {r}})
			leaks(t, r, raw, answers, b)
			joined += b
		}
		if find.Found([]byte(joined)) || !strings.Contains(joined, apicatalog.Redacted) {
			t.Errorf("three ranges joined: %q", joined)
		}
	})
	t.Run("clean answer passes a refusing API", func(t *testing.T) {
		_, answers, b := exchange(t, run, "strict.api.codemode", "/clean", nil)
		if answers[0].StatusCode != 200 || b != "nothing echoed" {
			t.Errorf("%s %q", answers[0].Status, b)
		}
	})
	t.Run("errors name the API, not its address", func(t *testing.T) {
		_, answers, b := exchange(t, run, "echo.api.codemode", "/%2e%2e/x", nil)
		if answers[0].StatusCode != http.StatusBadRequest || strings.Contains(b, strings.TrimPrefix(echo.URL, "http://")) {
			t.Errorf("%s %q", answers[0].Status, b)
		}
	})
}

// BenchmarkAPIRedaction forwards 64 KiB of JSON from an API through the
// gate to a program, from an API with a credential (the answer is looked
// at for it in every form) and from the same API without one, in the same
// run:
//
//	go test -run '^$' -bench APIRedaction ./agent/internal/egressgate/
func BenchmarkAPIRedaction(b *testing.B) {
	echo := apistest.NewEcho(b, "Authorization")
	decl := fmt.Sprintf(`{"apis": [
		{"name": "cred", "base_url": %[1]q, "credential": {"header": "Authorization", "prefix": "Bearer ", "secret_env": "T"}},
		{"name": "plain", "base_url": %[1]q}]}`, echo.URL)
	catalog, err := apicatalog.Parse([]byte(decl), apicatalog.WithGetenv(func(string) string { return "ghp_bench0123456789abcdefghijklmnopqrstu" }))
	if err != nil {
		b.Fatal(err)
	}
	g := New(Config{APIs: catalog})
	defer g.Close()
	run := g.Begin(&executionv1.Egress{Allow: []*executionv1.EgressRule{{Host: "*.api.codemode"}}}, "t", "r")
	for _, api := range []string{"plain", "cred"} {
		b.Run(api, func(b *testing.B) {
			b.SetBytes(64 << 10)
			b.ReportAllocs()
			for b.Loop() {
				res, err := getB(b, run, api+".api.codemode", "/big")
				if err != nil || len(res) != 64<<10 {
					b.Fatalf("%d bytes, %v", len(res), err)
				}
			}
		})
	}
}

// getB is get for benchmarks: the body of a GET for path on a new
// connection of run to the API host.
func getB(b *testing.B, run *Run, host, path string) ([]byte, error) {
	serve, err := run.Open(b.Context(), host, 80)
	if err != nil {
		return nil, err
	}
	program, agent := newPipe()
	defer program.Close()
	defer agent.Close()
	go serve(agent)
	req, _ := http.NewRequest("GET", "http://"+host+path, nil)
	req.Close = true
	if err := req.Write(program); err != nil {
		return nil, err
	}
	res, err := http.ReadResponse(bufio.NewReader(program), req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	return io.ReadAll(res.Body)
}
