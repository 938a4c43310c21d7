package e2e

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// API keys of the hostile-client tests' tenants.
const (
	hostileKeyAlpha = "k-hostile-alpha-0123456789"
	hostileKeyBeta  = "k-hostile-beta-01234567890"
)

// hostileEdge starts an edge with API keys for the tenants alpha and beta
// in front of s's control plane, with the given extra flags.
func hostileEdge(t testing.TB, s *Stack, args ...string) *Process {
	t.Helper()
	keys := filepath.Join(t.TempDir(), "keys.json")
	b, _ := json.Marshal(map[string]string{hostileKeyAlpha: "alpha", hostileKeyBeta: "beta"})
	if err := os.WriteFile(keys, b, 0o600); err != nil {
		t.Fatal(err)
	}
	edge, err := s.StartEdge(nil, append([]string{"--api-keys", keys}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = edge.Stop(30 * time.Second) })
	return edge
}

// keyClient is an h2c client that sends key as a bearer token.
func keyClient(key string) *http.Client {
	c := server.NewClient()
	c.Transport = bearerTransport{secret: key, base: c.Transport}
	return c
}

// procStatusKiB reads a field such as VmRSS or VmHWM of p's
// /proc/PID/status, in KiB.
func procStatusKiB(t testing.TB, p *Process, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.Atoi(strings.Fields(v)[0])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, p.Pid())
	return 0
}

// hugeBody is a request body of n bytes made as it is read: prefix, then
// filler. It counts what the client sent.
type hugeBody struct {
	prefix []byte
	left   int64
	sent   atomic.Int64
}

func newHugeBody(prefix []byte, n int64) *hugeBody {
	return &hugeBody{prefix: prefix, left: n}
}

func (h *hugeBody) Read(p []byte) (int, error) {
	if h.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > h.left {
		p = p[:h.left]
	}
	n := copy(p, h.prefix)
	h.prefix = h.prefix[n:]
	for i := n; i < len(p); i++ {
		p[i] = 'x'
	}
	h.left -= int64(len(p))
	h.sent.Add(int64(len(p)))
	return len(p), nil
}

// envelope is the 5-byte gRPC envelope of a message of size bytes.
func envelope(size int) []byte {
	b := make([]byte, 5)
	binary.BigEndian.PutUint32(b[1:], uint32(size))
	return b
}

// refusal is how a door answered a request it refused.
type refusal struct {
	status int
	code   string // the Connect or gRPC code, or "" for plain HTTP
	text   string // the message, or the body
}

// grpcCodes names the gRPC status numbers the tests expect.
var grpcCodes = map[string]string{"8": "resource_exhausted", "16": "unauthenticated"}

// readRefusal reads res as the door's protocol writes errors.
func readRefusal(res *http.Response, door string) refusal {
	b, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	r := refusal{status: res.StatusCode, text: string(b)}
	switch door {
	case "connect":
		var e struct{ Code, Message string }
		if json.Unmarshal(b, &e) == nil {
			r.code, r.text = e.Code, e.Message
		}
	case "grpc", "grpcweb":
		st, msg := res.Header.Get("Grpc-Status"), res.Header.Get("Grpc-Message")
		if st == "" {
			st, msg = res.Trailer.Get("Grpc-Status"), res.Trailer.Get("Grpc-Message")
		}
		if st == "" { // gRPC-Web trailers in the body
			for line := range strings.SplitSeq(string(b), "\r\n") {
				if v, ok := strings.CutPrefix(strings.ToLower(line), "grpc-status:"); ok {
					st = strings.TrimSpace(v)
				}
			}
		}
		r.code = grpcCodes[st]
		if r.code == "" {
			r.code = "grpc-status " + st
		}
		r.text = msg
	}
	return r
}

// door is a door of the edge that TestHostileLargeBodies sends huge bodies to.
type door struct {
	name, path, contentType string
	prefix                  []byte
	h2                      bool
}

// TestHostileLargeBodies sends four 100 MB bodies at once to every door of
// an edge with API keys, with a declared Content-Length and without one,
// with a valid key and with none: each is refused with a clear size error
// (resource_exhausted or HTTP 413) or as unauthenticated, and the edge's
// peak resident memory stays under 150 MB.
func TestHostileLargeBodies(t *testing.T) {
	t.Parallel()
	s := shared(t)
	edge := hostileEdge(t, s) // the default limits: --max-request-bytes 8 MiB, --large-bodies 1
	c := edgev1connect.NewExecutionServiceClient(keyClient(hostileKeyAlpha), edge.URL())
	if _, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"})); err != nil {
		t.Fatalf("warm-up run: %v\n%s", err, edge.Logs())
	}
	const size = 100 << 20
	const maxHWM = 150 << 10 // KiB
	rssBefore, hwmBefore := procStatusKiB(t, edge, "VmRSS"), procStatusKiB(t, edge, "VmHWM")

	doors := []door{
		{"connect", "/codemode.edge.v1.ExecutionService/Execute", "application/json", []byte(`{"language":"python","code":"`), false},
		{"grpc", "/codemode.edge.v1.ExecutionService/Execute", "application/grpc", envelope(size - 5), true},
		{"grpcweb", "/codemode.edge.v1.ExecutionService/Execute", "application/grpc-web+proto", envelope(size - 5), false},
		{"mcp", "/mcp", "application/json", []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"execute_code","arguments":{"code":"`), false},
		{"mcp-no-code-execute", "/mcp-no-code-execute", "application/json", []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"x":"`), false},
		{"no-code/mcp", "/no-code/mcp", "application/json", []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"x":"`), false},
		{"run", "/run", "application/json", []byte(`{"language":"python","code":"`), false},
	}
	for _, d := range doors {
		for _, declared := range []bool{true, false} {
			for _, key := range []string{hostileKeyAlpha, ""} {
				name := fmt.Sprintf("%s/declared=%v/key=%v", d.name, declared, key != "")
				var wg sync.WaitGroup
				for i := range 4 {
					wg.Go(func() {
						sendHugeBody(t, edge, d, declared, key, name, i, size)
					})
				}
				wg.Wait()
				t.Logf("%s: VmHWM %d KiB", name, procStatusKiB(t, edge, "VmHWM"))
			}
		}
	}
	rss, hwm := procStatusKiB(t, edge, "VmRSS"), procStatusKiB(t, edge, "VmHWM")
	t.Logf("edge memory: VmRSS %d -> %d KiB, VmHWM %d -> %d KiB (limit %d KiB)", rssBefore, rss, hwmBefore, hwm, maxHWM)
	if hwm > maxHWM {
		t.Errorf("the edge's peak resident memory reached %d KiB, over %d KiB", hwm, maxHWM)
	}
	// The edge still serves.
	if _, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"})); err != nil {
		t.Fatalf("run after the large bodies: %v", err)
	}
}

// sendHugeBody sends a body of size bytes, its length declared or not, with key
// or none, to door d of edge, and checks how it is refused; the first of a
// round is logged.
func sendHugeBody(t *testing.T, edge *Process, d door, declared bool, key, name string, i int, size int64) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	body := newHugeBody(d.prefix, size)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, edge.URL()+d.path, io.NopCloser(body))
	if declared {
		req.ContentLength = size
	}
	req.Header.Set("Content-Type", d.contentType)
	req.Header.Set("Accept", "application/json, text/event-stream")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	client := testkit.HTTP1Client()
	if d.h2 {
		req.Header.Set("Te", "trailers")
		client = server.NewClient()
	}
	defer client.CloseIdleConnections()
	start := time.Now()
	res, err := client.Do(req)
	if err != nil {
		t.Errorf("%s #%d: %v (sent %d bytes)", name, i, err, body.sent.Load())
		return
	}
	defer res.Body.Close()
	r := readRefusal(res, d.name)
	if err := checkRefusal(d.name, key != "", r); err != nil {
		t.Errorf("%s #%d: %v", name, i, err)
	}
	if i == 0 {
		t.Logf("%s: %d %s %q after %s, %d MB sent", name, r.status, r.code, r.text, time.Since(start).Round(time.Millisecond), body.sent.Load()>>20)
	}
}

// checkRefusal says what is wrong with how door refused a 100 MB body.
func checkRefusal(door string, withKey bool, r refusal) error {
	switch {
	case !withKey && (door == "grpc" || door == "grpcweb" || door == "connect"):
		if r.code != "unauthenticated" {
			return fmt.Errorf("got %d %s %q, want unauthenticated", r.status, r.code, r.text)
		}
	case !withKey:
		if r.status != http.StatusUnauthorized {
			return fmt.Errorf("got HTTP %d %q, want 401", r.status, r.text)
		}
	case door == "grpc" || door == "grpcweb" || door == "connect":
		if r.code != "resource_exhausted" || !strings.Contains(r.text, "larger than") {
			return fmt.Errorf("got %d %s %q, want resource_exhausted saying the message is too large", r.status, r.code, r.text)
		}
	default:
		if r.status != http.StatusRequestEntityTooLarge || !(strings.Contains(r.text, "larger than") || strings.Contains(r.text, "exceeds")) {
			return fmt.Errorf("got HTTP %d %q, want 413 saying the body is too large", r.status, r.text)
		}
	}
	return nil
}

// TestHostileSlowBodies opens 200 HTTP/1.1 connections to an edge with
// --body-timeout 2s, each sending its body a byte a second to a door
// (Connect, MCP, seed /run). The edge closes every one soon after the body
// timeout, and serves a normal run meanwhile.
func TestHostileSlowBodies(t *testing.T) {
	t.Parallel()
	s := shared(t)
	const (
		conns   = 200
		timeout = 2 * time.Second
		// slack for a loaded 2-CPU machine running other tests.
		slack = 8 * time.Second
	)
	edge, c := warmEdge(t, s, "--body-timeout", timeout.String())
	paths := []string{"/codemode.edge.v1.ExecutionService/Execute", "/mcp", "/run"}

	var (
		opened  sync.WaitGroup
		mu      sync.Mutex
		closeAt []time.Duration // since each connection sent its header
		stuck   int
		early   int
	)
	attack := time.Now()
	var wg sync.WaitGroup
	for i := range conns {
		opened.Add(1)
		wg.Go(func() {
			d, closed, err := slowBody(edge.Addr, paths[i%len(paths)], timeout+slack, opened.Done)
			if err != nil {
				t.Errorf("connection %d: %v", i, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if !closed {
				stuck++
				return
			}
			closeAt = append(closeAt, d)
			if d < timeout {
				early++
			}
		})
	}
	opened.Wait()
	openedIn := time.Since(attack)

	// A normal caller is served while the slow bodies hold their connections.
	mu.Lock()
	closedAtRunStart := len(closeAt)
	mu.Unlock()
	runStart := time.Now()
	res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"}))
	runTook := time.Since(runStart)
	mu.Lock()
	closedBeforeRun := len(closeAt)
	mu.Unlock()
	if err != nil || res.Msg.GetResult().GetStdout() != "1\n" {
		t.Errorf("a normal run during the attack: %v %v", res, err)
	}
	wg.Wait()

	slices.Sort(closeAt)
	t.Logf("%d slow connections opened in %s; a normal run started with %d of them closed and took %s, with %d closed by its end",
		conns, openedIn.Round(time.Millisecond), closedAtRunStart, runTook.Round(time.Millisecond), closedBeforeRun)
	if len(closeAt) > 0 {
		t.Logf("closed after the header: min %s, p50 %s, max %s (body timeout %s)", closeAt[0].Round(time.Millisecond),
			closeAt[len(closeAt)/2].Round(time.Millisecond), closeAt[len(closeAt)-1].Round(time.Millisecond), timeout)
	}
	if stuck > 0 {
		t.Errorf("%d of %d slow connections were still open %s after their header", stuck, conns, timeout+slack)
	}
	if early > 0 {
		t.Errorf("%d slow connections were closed before the body timeout", early)
	}
	if closedAtRunStart == conns {
		t.Errorf("every slow connection was closed before the normal run started (%s after the first): the run did not overlap the attack", openedIn)
	}
}

// warmEdge starts an edge of s with args, and runs print(1) through it.
func warmEdge(t *testing.T, s *Stack, args ...string) (*Process, edgev1connect.ExecutionServiceClient) {
	t.Helper()
	edge, err := s.StartEdge(nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = edge.Stop(30 * time.Second) })
	c := edgev1connect.NewExecutionServiceClient(httpClient, edge.URL())
	if _, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"})); err != nil {
		t.Fatalf("warm-up run: %v", err)
	}
	return edge, c
}

// slowBody opens a connection to addr and sends the header of a POST to
// path with a body of 1000 bytes, then calls sent (also when it could not),
// and sends a byte of the body a second until the server closes the
// connection or wait has passed since the header. It returns how long after
// the header the server closed it, and whether it did.
func slowBody(addr, path string, wait time.Duration, sent func()) (time.Duration, bool, error) {
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		sent()
		return 0, false, err
	}
	defer conn.Close()
	// Taken before the header goes: the edge's timeout starts later, when
	// it has read it.
	sentHeader := time.Now()
	_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 1000\r\n\r\n", path, addr)
	sent()
	if err != nil {
		return 0, false, err
	}
	closed := make(chan struct{})
	go func() {
		_ = conn.SetReadDeadline(time.Now().Add(wait + 5*time.Second))
		_, _ = io.Copy(io.Discard, conn)
		close(closed)
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-closed:
			return time.Since(sentHeader), true, nil
		case <-tick.C:
			if time.Since(sentHeader) > wait {
				return 0, false, nil
			}
			_, _ = conn.Write([]byte(" "))
		}
	}
}

// TestHostileTenantLimits has tenant alpha go over its concurrency limit,
// then over its rate limit: alpha gets resource_exhausted naming the limit,
// with a retry hint, and tenant beta's runs in the same second succeed.
func TestHostileTenantLimits(t *testing.T) {
	t.Parallel()
	s := shared(t)
	t.Run("concurrency", func(t *testing.T) { tenantConcurrencyLimit(t, s) })
	t.Run("rate", func(t *testing.T) { tenantRateLimit(t, s) })
}

// runPython runs code in Python through c.
func runPython(ctx context.Context, c edgev1connect.ExecutionServiceClient, code string) (*connect.Response[edgev1.ExecuteResponse], error) {
	return c.Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: code}))
}

// wantRefused checks that err refuses a run for the limit named, with a
// retry hint in its message and a Retry-After header.
func wantRefused(t *testing.T, err error, limit string) {
	t.Helper()
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted {
		t.Fatalf("got %v, want resource_exhausted", err)
	}
	if !strings.Contains(ce.Message(), limit) || !strings.Contains(ce.Message(), "retry after") {
		t.Errorf("message %q does not name the %s limit and a retry hint", ce.Message(), limit)
	}
	if ra := ce.Meta().Get("Retry-After"); ra == "" {
		t.Errorf("no Retry-After header (meta %v)", ce.Meta())
	}
}

// tenantConcurrencyLimit checks --tenant-concurrency: a tenant at its limit is
// refused with a retry hint, on every door, and another tenant is served.
func tenantConcurrencyLimit(t *testing.T, s *Stack) {
	t.Parallel()
	edge := hostileEdge(t, s, "--tenant-concurrency", "2", "--tenant-rate", "0")
	alpha := edgev1connect.NewExecutionServiceClient(keyClient(hostileKeyAlpha), edge.URL())
	alphaGRPC := edgev1connect.NewExecutionServiceClient(keyClient(hostileKeyAlpha), edge.URL(), connect.WithGRPC())
	beta := edgev1connect.NewExecutionServiceClient(keyClient(hostileKeyBeta), edge.URL())
	// Two long runs hold alpha's two slots until the test ends (each
	// tries again while the probes below hold a slot).
	holdCtx, release := context.WithCancel(t.Context())
	var holders sync.WaitGroup
	defer func() { release(); holders.Wait() }()
	for range 2 {
		holders.Go(func() {
			for range 500 {
				_, err := runPython(holdCtx, alpha, "import time; time.sleep(60)")
				if holdCtx.Err() != nil {
					return
				}
				if connect.CodeOf(err) != connect.CodeResourceExhausted {
					t.Errorf("holding run ended early: %v", err)
					return
				}
				time.Sleep(20 * time.Millisecond) // refused while the other holder has the slot: try again
			}
		})
	}
	// Wait until a third call of alpha is refused: the probes go one at
	// a time, so both holders are in flight then.
	refused := func() error {
		var err error
		testkit.Until(10*time.Second, func() bool {
			_, err = runPython(t.Context(), alphaGRPC, "print(1)")
			return connect.CodeOf(err) == connect.CodeResourceExhausted
		})
		return err
	}
	wantRefused(t, refused(), "concurrency limit")
	// Beta is let in at once, and served, while alpha's slots are held.
	start := time.Now()
	res, err := runPython(t.Context(), beta, "print(2)")
	if err != nil || res.Msg.GetResult().GetStdout() != "2\n" {
		t.Fatalf("beta while alpha is at its limit: %v %v", res, err)
	}
	t.Logf("beta's run took %s while alpha was at its limit", time.Since(start).Round(time.Millisecond))
	// Alpha is still at its limit; the seed door carries the hint as a
	// header too.
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, edge.URL()+"/run", strings.NewReader(`{"code":"print(1)"}`))
	req.Header.Set("Authorization", "Bearer "+hostileKeyAlpha)
	req.Header.Set("Content-Type", "application/json")
	hres, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(hres.Body)
	hres.Body.Close()
	if hres.StatusCode != http.StatusTooManyRequests || hres.Header.Get("Retry-After") == "" || !strings.Contains(string(b), "concurrency limit") {
		t.Errorf("POST /run over the limit: %s Retry-After %q %s", hres.Status, hres.Header.Get("Retry-After"), b)
	}
}

// tenantRateLimit checks --tenant-rate and --tenant-burst: a burst past a
// tenant's bucket is refused, and another tenant's bucket is its own.
func tenantRateLimit(t *testing.T, s *Stack) {
	t.Parallel()
	edge := hostileEdge(t, s, "--tenant-concurrency", "0", "--tenant-rate", "1", "--tenant-burst", "3")
	alpha := edgev1connect.NewExecutionServiceClient(keyClient(hostileKeyAlpha), edge.URL())
	beta := edgev1connect.NewExecutionServiceClient(keyClient(hostileKeyBeta), edge.URL())
	// Eight calls at once: the burst of three goes through, most of
	// the rest are refused (a token comes back each second).
	errs := make([]error, 8)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { _, errs[i] = runPython(t.Context(), alpha, "print(1)") })
	}
	wg.Wait()
	refusedAt := time.Now()
	var ok, refused int
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case connect.CodeOf(err) == connect.CodeResourceExhausted:
			refused++
			wantRefused(t, err, "rate limit")
		default:
			t.Errorf("alpha: %v", err)
		}
	}
	if ok < 3 || refused < 1 {
		t.Fatalf("alpha: %d runs served and %d refused, want the burst of 3 served and some refused", ok, refused)
	}
	// Beta has its own bucket: its burst goes through in the same second.
	for i := range 3 {
		wg.Go(func() {
			if res, err := runPython(t.Context(), beta, "print(2)"); err != nil || res.Msg.GetResult().GetStdout() != "2\n" {
				t.Errorf("beta's run %d after alpha's refusal: %v %v", i, res, err)
			}
		})
	}
	wg.Wait()
	t.Logf("alpha: %d served, %d refused; beta's 3 runs served within %s of the refusals", ok, refused, time.Since(refusedAt).Round(time.Millisecond))
}

// BenchmarkEdgeLimits measures what API keys and every limit (body size,
// body timeout, idle timeout, connection cap, tenant concurrency and rate)
// add to a run: print(1) through an edge with them all and an edge with
// none, in front of the same control plane and agent, interleaved in the
// same run (each iteration calls both, in alternating order).
//
//	go test -run '^$' -bench EdgeLimits -benchtime 200x ./edge/e2e/
func BenchmarkEdgeLimits(b *testing.B) {
	dockertest.Need(b)
	s, err := StartStack("e2e-bench-limits", "--min-active", "4")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Stop)
	on := hostileEdge(b, s) // keys, and the default limits
	off, err := s.StartEdge(nil, "--max-request-bytes", "0", "--body-timeout", "0", "--idle-timeout", "0", "--max-conns", "0",
		"--tenant-concurrency", "0", "--tenant-rate", "0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = off.Stop(30 * time.Second) })
	on1 := edgev1connect.NewExecutionServiceClient(keyClient(hostileKeyAlpha), on.URL())
	off1 := edgev1connect.NewExecutionServiceClient(server.NewClient(), off.URL())
	runOnce := func(c edgev1connect.ExecutionServiceClient) func() {
		return func() {
			res, err := c.Execute(context.Background(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"}))
			if err != nil || res.Msg.GetResult().GetStdout() != "1\n" {
				b.Fatalf("run: %v %v", res, err)
			}
		}
	}
	pairedLatency(b, pair{"on", runOnce(on1)}, pair{"off", runOnce(off1)})
}
