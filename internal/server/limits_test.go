package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/testkit"
)

// waitFor is how long the handlers below keep a call open after its body
// was read: several body timeouts.
const waitFor = 400 * time.Millisecond

// slowService runs Execute and ExecuteStream for the tests: code "wait"
// keeps the call open for waitFor and fails if its context ends first.
type slowService struct {
	agentv1connect.UnimplementedAgentServiceHandler
}

func (slowService) Execute(ctx context.Context, req *connect.Request[agentv1.ExecuteRequest]) (*connect.Response[agentv1.ExecuteResponse], error) {
	if req.Msg.GetExecution().GetCode() == "wait" {
		if err := sleepCtx(ctx, waitFor); err != nil {
			return nil, err
		}
	}
	return connect.NewResponse(&agentv1.ExecuteResponse{Result: &executionv1.Result{Stdout: "ok"}}), nil
}

func (slowService) ExecuteStream(ctx context.Context, _ *connect.Request[agentv1.ExecuteStreamRequest], st *connect.ServerStream[agentv1.ExecuteStreamResponse]) error {
	for range 4 {
		if err := st.Send(&agentv1.ExecuteStreamResponse{}); err != nil {
			return err
		}
		if err := sleepCtx(ctx, waitFor/4); err != nil {
			return err
		}
	}
	return st.Send(&agentv1.ExecuteStreamResponse{Event: &executionv1.Event{Event: &executionv1.Event_Result{Result: &executionv1.Result{Stdout: "ok"}}}})
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return connect.NewError(connect.CodeCanceled, fmt.Errorf("the call's context ended early: %w", context.Cause(ctx)))
	case <-time.After(d):
		return nil
	}
}

// plainHandler serves /plain: POST reads the whole body (413 on
// *http.MaxBytesError, as the MCP SDK does), then with ?wait keeps the call
// open for waitFor; GET streams four chunks over waitFor, like an SSE
// stream. Both fail with 499 if the request's context ends early.
func plainHandler(calls *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		switch r.Method {
		case http.MethodGet:
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 4 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				_ = http.NewResponseController(w).Flush()
				if sleepCtx(r.Context(), waitFor/4) != nil {
					return
				}
			}
			fmt.Fprint(w, "data: ok\n\n")
		default:
			n, err := io.Copy(io.Discard, r.Body)
			if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
				http.Error(w, fmt.Sprintf("request body exceeds %d bytes", mbe.Limit), http.StatusRequestEntityTooLarge)
				return
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			if r.URL.Query().Has("wait") && sleepCtx(r.Context(), waitFor) != nil {
				w.WriteHeader(499)
				return
			}
			fmt.Fprintf(w, "read %d", n)
		}
	})
}

type limitedServer struct {
	*Server
	url   string
	addr  string
	calls atomic.Int64 // calls of the plain handler
}

// serveLimited serves slowService and plainHandler with limits on 127.0.0.1.
func serveLimited(t *testing.T, l Limits) *limitedServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ls := &limitedServer{addr: ln.Addr().String(), url: "http://" + ln.Addr().String()}
	s := New(slog.New(slog.DiscardHandler))
	s.Limits = l
	ls.Server = s
	s.HandleService(agentv1connect.NewAgentServiceHandler(slowService{}, s.HandlerOptions()...))
	s.Handle("/plain", plainHandler(&ls.calls))
	serveOn(t, s, ln)
	return ls
}

// clients are the two transports a server must hold for.
var clients = map[string]func() *http.Client{"http1": testkit.HTTP1Client, "h2c": NewClient}

// generator is an endless (or n-byte) body that counts what was read of it.
type generator struct {
	n    int64 // bytes left; < 0: endless
	read atomic.Int64
}

func (g *generator) Read(p []byte) (int, error) {
	if g.n == 0 {
		return 0, io.EOF
	}
	if g.n > 0 && int64(len(p)) > g.n {
		p = p[:g.n]
	}
	for i := range p {
		p[i] = 'x'
	}
	if g.n > 0 {
		g.n -= int64(len(p))
	}
	g.read.Add(int64(len(p)))
	return len(p), nil
}

func execReq(code string) *agentv1.ExecuteRequest {
	return &agentv1.ExecuteRequest{Execution: &executionv1.Execution{Language: "python", Code: code}}
}

func TestMessageSizeLimit(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	ls := serveLimited(t, Limits{MaxRequestBytes: limit})
	protocols := map[string][]connect.ClientOption{
		"connect": nil, "connect+json": {connect.WithProtoJSON()},
		"grpc": {connect.WithGRPC()}, "grpcweb": {connect.WithGRPCWeb()},
	}
	for name, opts := range protocols {
		for _, tc := range []struct {
			size int
			code connect.Code
		}{
			{limit / 2, 0},
			{limit + 1024, connect.CodeResourceExhausted}, // Connect's own limit
			{16 * limit, connect.CodeResourceExhausted},   // the declared length, where there is one
		} {
			t.Run(fmt.Sprintf("%s/%d", name, tc.size), func(t *testing.T) {
				t.Parallel()
				c := agentv1connect.NewAgentServiceClient(NewClient(), ls.url, opts...)
				req := execReq("x")
				// The request id is not validated before Connect reads the
				// message, so it makes a message of the size wanted.
				req.RequestId = strings.Repeat("r", tc.size)
				_, err := c.Execute(t.Context(), connect.NewRequest(req))
				if got := connect.CodeOf(err); tc.code == 0 && err != nil && got != connect.CodeInvalidArgument {
					t.Fatalf("%d bytes under the limit: %v", tc.size, err)
				} else if tc.code != 0 && got != tc.code {
					t.Fatalf("%d bytes: got %v, want %s", tc.size, err, tc.code)
				}
				if tc.code != 0 && !strings.Contains(err.Error(), "larger than") {
					t.Errorf("message %q does not say the request is too large", err)
				}
			})
		}
	}
}

// TestMessageSizeLimitUndeclared sends bodies with no Content-Length,
// endless, in the raw wire formats: Connect unary over HTTP/1.1 (chunked)
// and gRPC over h2c with an envelope that announces a huge message. Each is
// answered resource_exhausted, and the server stops reading far short of
// the body.
func TestMessageSizeLimitUndeclared(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	ls := serveLimited(t, Limits{MaxRequestBytes: limit})
	path := ls.url + agentv1connect.AgentServiceExecuteProcedure

	t.Run("connect-chunked", func(t *testing.T) {
		t.Parallel()
		g := &generator{n: -1}
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, path, g)
		req.Header.Set("Content-Type", "application/proto")
		res, err := testkit.HTTP1Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var body struct{ Code, Message string }
		_ = json.NewDecoder(res.Body).Decode(&body)
		if body.Code != "resource_exhausted" {
			t.Fatalf("got %s %+v, want resource_exhausted", res.Status, body)
		}
	})
	t.Run("grpc-envelope", func(t *testing.T) {
		t.Parallel()
		var prefix [5]byte
		binary.BigEndian.PutUint32(prefix[1:], 1<<30)
		g := &generator{n: -1}
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, path, io.MultiReader(bytes.NewReader(prefix[:]), g))
		req.Header.Set("Content-Type", "application/grpc")
		req.Header.Set("Te", "trailers")
		res, err := NewClient().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		st := res.Trailer.Get("Grpc-Status")
		if st == "" {
			st = res.Header.Get("Grpc-Status")
		}
		if st != fmt.Sprint(int(connect.CodeResourceExhausted)) {
			t.Fatalf("grpc-status %q (%s %v %v), want %d", st, res.Status, res.Header, res.Trailer, connect.CodeResourceExhausted)
		}
		// HTTP/2 flow control bounds what the client could send beyond
		// what the server read.
		if n := g.read.Load(); n > 8<<20 {
			t.Errorf("the client sent %d bytes of an endless body", n)
		}
	})
}

func TestPlainBodyLimit(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	for name, client := range clients {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range []struct {
				name     string
				size     int64
				declared bool
				status   int
				called   bool
			}{
				{"under", limit, true, http.StatusOK, true},
				{"declared-over", 1 << 30, true, http.StatusRequestEntityTooLarge, false},
				{"undeclared-over", 1 << 30, false, http.StatusRequestEntityTooLarge, true},
			} {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					ls := serveLimited(t, Limits{MaxRequestBytes: limit})
					g := &generator{n: tc.size}
					req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, ls.url+"/plain", io.NopCloser(g))
					if tc.declared {
						req.ContentLength = tc.size
					}
					res, err := client().Do(req)
					if err != nil {
						t.Fatal(err)
					}
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					if res.StatusCode != tc.status {
						t.Fatalf("got %s %q, want %d", res.Status, b, tc.status)
					}
					if called := ls.calls.Load() > 0; called != tc.called {
						t.Errorf("handler called: %v, want %v", called, tc.called)
					}
					if tc.declared && tc.status == http.StatusRequestEntityTooLarge {
						var e struct{ Error, Code string }
						if err := json.Unmarshal(b, &e); err != nil || e.Code != "resource_exhausted" || !strings.Contains(e.Error, "larger than the limit of 65536 bytes") {
							t.Errorf("body %q: want a JSON error saying the limit", b)
						}
					}
					if tc.status != http.StatusOK && g.read.Load() >= tc.size/4 {
						t.Errorf("the client sent %d of %d bytes", g.read.Load(), tc.size)
					}
				})
			}
		})
	}
}

// TestBodyTimeoutHTTP1 sends a body a byte at a time on a raw HTTP/1.1
// connection: the server fails the request and closes the connection soon
// after the body timeout.
func TestBodyTimeoutHTTP1(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	ls := serveLimited(t, Limits{BodyTimeout: timeout})
	for _, path := range []string{"/plain", agentv1connect.AgentServiceExecuteProcedure} {
		t.Run(strings.Trim(path, "/"), func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("tcp", ls.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/proto\r\nContent-Length: 1000\r\n\r\n", path)
			closed := make(chan time.Duration, 1)
			go func() {
				_, _ = io.Copy(io.Discard, conn)
				closed <- time.Since(start)
			}()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case d := <-closed:
					if d < timeout {
						t.Fatalf("closed after %s, before the body timeout", d)
					}
					t.Logf("closed after %s", d)
					return
				case <-tick.C:
					if time.Since(start) > timeout+5*time.Second {
						t.Fatal("the connection is still open 5 s after the body timeout")
					}
					_, _ = conn.Write([]byte("x"))
				}
			}
		})
	}
}

// TestBodyTimeoutH2C sends a body slowly on one HTTP/2 stream: that stream
// fails soon after the body timeout, and other calls on the same connection
// are served meanwhile.
func TestBodyTimeoutH2C(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	ls := serveLimited(t, Limits{BodyTimeout: timeout})
	client := NewClient()
	pr, pw := io.Pipe()
	go func() {
		for range 200 {
			if _, err := pw.Write([]byte("x")); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond) // a slow client: a byte every 50 ms
		}
		pw.Close()
	}()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, ls.url+"/plain", pr)
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		res, err := client.Do(req)
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "timeout") {
				err = fmt.Errorf("got %s %q, want 400 for a timeout", res.Status, b)
			}
		}
		done <- err
	}()
	c := agentv1connect.NewAgentServiceClient(client, ls.url, connect.WithGRPC())
	if _, err := c.Execute(t.Context(), connect.NewRequest(execReq("x"))); err != nil {
		t.Fatalf("a call next to the slow one: %v", err)
	}
	select {
	case err := <-done:
		pr.CloseWithError(errors.New("done"))
		if err != nil {
			t.Fatal(err)
		}
		d := time.Since(start)
		t.Logf("the slow stream ended after %s", d)
		if d < timeout || d > timeout+5*time.Second {
			t.Fatalf("the slow stream ended after %s, want about %s", d, timeout)
		}
	case <-time.After(timeout + 10*time.Second):
		t.Fatal("the slow stream is still open 10 s after the body timeout")
	}
}

// TestBodyTimeoutSparesLongCalls checks that the body timeout ends with the
// body: calls that run, stream or hold an SSE response well past it are not
// cut, over HTTP/1.1 and h2c, and an HTTP/1.1 connection is reused after.
func TestBodyTimeoutSparesLongCalls(t *testing.T) {
	t.Parallel()
	const timeout = 100 * time.Millisecond
	ls := serveLimited(t, Limits{BodyTimeout: timeout, MaxRequestBytes: 1 << 20, IdleTimeout: time.Minute})
	for name, newClient := range clients {
		protocols := map[string][]connect.ClientOption{"connect": nil, "grpcweb": {connect.WithGRPCWeb()}}
		if name == "h2c" {
			protocols["grpc"] = []connect.ClientOption{connect.WithGRPC()}
		}
		for protocol, opts := range protocols {
			t.Run(name+"/"+protocol+"/unary", func(t *testing.T) {
				t.Parallel()
				c := agentv1connect.NewAgentServiceClient(newClient(), ls.url, opts...)
				for i := range 2 {
					res, err := c.Execute(t.Context(), connect.NewRequest(execReq("wait")))
					if err != nil || res.Msg.GetResult().GetStdout() != "ok" {
						t.Fatalf("call %d: %v %v", i, res, err)
					}
				}
			})
			t.Run(name+"/"+protocol+"/stream", func(t *testing.T) {
				t.Parallel()
				c := agentv1connect.NewAgentServiceClient(newClient(), ls.url, opts...)
				st, err := c.ExecuteStream(t.Context(), connect.NewRequest(&agentv1.ExecuteStreamRequest{Execution: execReq("wait").GetExecution()}))
				if err != nil {
					t.Fatal(err)
				}
				defer st.Close()
				var last *agentv1.ExecuteStreamResponse
				for st.Receive() {
					last = proto.CloneOf(st.Msg())
				}
				if err := st.Err(); err != nil || last.GetEvent().GetResult().GetStdout() != "ok" {
					t.Fatalf("stream: last %v, %v", last, err)
				}
			})
		}
		t.Run(name+"/plain-post", func(t *testing.T) {
			t.Parallel()
			client := newClient()
			var reused []bool
			for range 2 {
				trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = append(reused, i.Reused) }}
				ctx := httptrace.WithClientTrace(t.Context(), trace)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ls.url+"/plain?wait", io.NopCloser(&generator{n: 1000}))
				res, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if string(b) != "read 1000" {
					t.Fatalf("got %s %q", res.Status, b)
				}
			}
			if len(reused) != 2 || !reused[1] {
				t.Errorf("connection reused: %v, want the second call on the first call's connection", reused)
			}
		})
		t.Run(name+"/sse-get", func(t *testing.T) {
			t.Parallel()
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, ls.url+"/plain", nil)
			res, err := newClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var lines []string
			sc := bufio.NewScanner(res.Body)
			for sc.Scan() {
				if sc.Text() != "" {
					lines = append(lines, sc.Text())
				}
			}
			if len(lines) != 5 || lines[4] != "data: ok" {
				t.Fatalf("stream cut: %q %v", lines, sc.Err())
			}
		})
	}
}

// TestLargeBodyTurns has one request hold the only turn to read a large
// body: another large body waits for it and, past its body timeout, fails
// saying the server is busy; small bodies pass meanwhile; once the turn is
// given back, large bodies are read again.
func TestLargeBodyTurns(t *testing.T) {
	t.Parallel()
	const timeout = 500 * time.Millisecond
	ls := serveLimited(t, Limits{LargeBodies: 1, BodyTimeout: 10 * time.Second, MaxRequestBytes: 8 << 20})
	post := func(ctx context.Context, body io.Reader) (string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, ls.url+"/plain", body)
		res, err := NewClient().Do(req)
		if err != nil {
			return "", err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return res.Status + " " + strings.TrimSpace(string(b)), err
	}

	// The holder sends just over 1 MiB, then stalls.
	pr, pw := io.Pipe()
	holder := make(chan string, 1)
	go func() {
		out, err := post(t.Context(), pr)
		if err != nil {
			out = err.Error()
		}
		holder <- out
	}()
	go func() {
		_, _ = pw.Write(make([]byte, largeBody+1024))
	}()
	testkit.WaitFor(t, 10*time.Second, "the holder to take a turn", func() bool { return len(ls.turns.slots(1)) > 0 })

	// Small bodies pass.
	if out, err := post(t.Context(), io.NopCloser(&generator{n: largeBody / 2})); err != nil || out != fmt.Sprintf("200 OK read %d", largeBody/2) {
		t.Fatalf("a small body while the turn is held: %q %v", out, err)
	}
	c := agentv1connect.NewAgentServiceClient(NewClient(), ls.url, connect.WithGRPC())
	if _, err := c.Execute(t.Context(), connect.NewRequest(execReq("x"))); err != nil {
		t.Fatalf("a small call while the turn is held: %v", err)
	}

	// A large body waits for the turn, and gives up at its body timeout.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	waiting := serveLimited(t, Limits{LargeBodies: 1, BodyTimeout: timeout, MaxRequestBytes: 8 << 20})
	waiting.turns.slots(1) <- struct{}{} // every turn taken
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, waiting.url+"/plain", io.NopCloser(&generator{n: 2 * largeBody}))
	res, err := NewClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if d := time.Since(start); res.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "busy") || d < timeout {
		t.Fatalf("a large body with no turn free: %s %q after %s, want 400 saying busy after %s", res.Status, b, d, timeout)
	}
	wc := agentv1connect.NewAgentServiceClient(NewClient(), waiting.url, connect.WithGRPC())
	big := execReq("x")
	big.RequestId = strings.Repeat("r", 2*largeBody)
	_, err = wc.Execute(ctx, connect.NewRequest(big))
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted || !strings.Contains(ce.Message(), "busy") || ce.Meta().Get("Retry-After") == "" {
		t.Fatalf("a large call with no turn free: %v, want resource_exhausted saying busy, with Retry-After", err)
	}
	<-waiting.turns.slots(1)

	// The holder finishes; its turn comes back, and a large body is read.
	pw.Close()
	if out := <-holder; out != fmt.Sprintf("200 OK read %d", largeBody+1024) {
		t.Fatalf("holder: %q", out)
	}
	if out, err := post(ctx, io.NopCloser(&generator{n: 2 * largeBody})); err != nil || out != fmt.Sprintf("200 OK read %d", 2*largeBody) {
		t.Fatalf("a large body after the turn came back: %q %v", out, err)
	}
	if n := len(ls.turns.slots(1)); n != 0 {
		t.Fatalf("%d turns still held after every request ended", n)
	}
}

// TestIdleTimeout checks that an idle HTTP/1.1 connection is closed.
func TestIdleTimeout(t *testing.T) {
	t.Parallel()
	const idle = 200 * time.Millisecond
	ls := serveLimited(t, Limits{IdleTimeout: idle})
	conn, err := net.Dial("tcp", ls.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "GET /healthz-none HTTP/1.1\r\nHost: x\r\n\r\n")
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	start := time.Now()
	_ = conn.SetReadDeadline(time.Now().Add(idle + 10*time.Second))
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("read on an idle connection: %v, want EOF", err)
	}
	if d := time.Since(start); d < idle/2 {
		t.Fatalf("closed after %s, before the idle timeout", d)
	}
}

// TestMaxConns checks that connections past the cap wait to be served until
// one closes.
func TestMaxConns(t *testing.T) {
	t.Parallel()
	ls := serveLimited(t, Limits{MaxConns: 2})
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", ls.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// A served connection answers a request; keep it open afterwards.
		fmt.Fprint(c, "GET /none HTTP/1.1\r\nHost: x\r\n\r\n")
		if _, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	third, err := net.Dial("tcp", ls.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	fmt.Fprint(third, "GET /none HTTP/1.1\r\nHost: x\r\n\r\n")
	answered := make(chan error, 1)
	go func() {
		_, err := http.ReadResponse(bufio.NewReader(third), nil)
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("a third connection was served while two were open (%v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	held[0].Close()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the third connection was not served after one closed")
	}
}

func TestLimitsValidate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		l  Limits
		ok bool
	}{
		"zero":             {Limits{}, true},
		"defaults":         {DefaultLimits(), true},
		"negative bytes":   {Limits{MaxRequestBytes: -1}, false},
		"huge bytes":       {Limits{MaxRequestBytes: 2 << 30}, false},
		"negative timeout": {Limits{BodyTimeout: -time.Second}, false},
		"negative idle":    {Limits{IdleTimeout: -time.Second}, false},
		"negative conns":   {Limits{MaxConns: -1}, false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if err := tc.l.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// BenchmarkServerLimits measures what the limits add to a small call: a
// unary call over h2c to a server with DefaultLimits and to one with none,
// interleaved, in the same run.
//
//	go test -run '^$' -bench ServerLimits ./internal/server/
func BenchmarkServerLimits(b *testing.B) {
	servers := []struct {
		name string
		l    Limits
		c    agentv1connect.AgentServiceClient
		lat  []time.Duration
	}{{name: "limits on", l: DefaultLimits()}, {name: "limits off"}}
	for i := range servers {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		s := New(slog.New(slog.DiscardHandler))
		s.Limits = servers[i].l
		s.HandleService(agentv1connect.NewAgentServiceHandler(slowService{}, s.HandlerOptions()...))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Serve(ctx, ln) }()
		b.Cleanup(func() { cancel(); <-done })
		servers[i].c = agentv1connect.NewAgentServiceClient(NewClient(), "http://"+ln.Addr().String(), connect.WithGRPC())
	}
	req := execReq("x")
	call := func(c agentv1connect.AgentServiceClient) time.Duration {
		start := time.Now()
		if _, err := c.Execute(context.Background(), connect.NewRequest(req)); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for range 100 {
		for i := range servers {
			call(servers[i].c)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		for j := range servers {
			sv := &servers[(i+j)%2]
			sv.lat = append(sv.lat, call(sv.c))
		}
	}
	b.StopTimer()
	reportP50s(b, [2]string{servers[0].name, servers[1].name}, [2]string{"on", "off"}, [2][]time.Duration{servers[0].lat, servers[1].lat})
}

// reportP50s logs the p50 and p95 of each side of a paired benchmark (names
// for the log) and reports their p50s, as "p50-SIDE-us" with sides, and
// the ratio of the first to the second.
func reportP50s(b *testing.B, names, sides [2]string, lat [2][]time.Duration) {
	b.Helper()
	var p50 [2]time.Duration
	for i, l := range lat {
		if len(l) == 0 {
			return
		}
		slices.Sort(l)
		p50[i] = l[(len(l)-1)/2]
		b.Logf("%-10s n=%d p50=%v p95=%v", names[i], len(l), p50[i], l[(len(l)-1)*95/100])
	}
	for i := range sides {
		b.ReportMetric(float64(p50[i].Nanoseconds())/1e3, "p50-"+sides[i]+"-us")
	}
	b.ReportMetric(float64(p50[0])/float64(p50[1]), "p50-ratio")
}
