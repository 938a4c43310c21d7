package server

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
)

type statusOnly struct {
	agentv1connect.UnimplementedAgentServiceHandler
}

func (statusOnly) Status(context.Context, *connect.Request[agentv1.StatusRequest]) (*connect.Response[agentv1.StatusResponse], error) {
	return connect.NewResponse(&agentv1.StatusResponse{Status: &agentv1.AgentStatus{Name: "x"}}), nil
}

// serveOn serves s on ln until t ends, and fails t if Serve then fails or
// does not return.
func serveOn(t testing.TB, s *Server, ln net.Listener) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("serve did not return after its context ended")
		}
	})
}

func serve(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(slog.New(slog.DiscardHandler))
	s.HandleService(agentv1connect.NewAgentServiceHandler(statusOnly{}, s.HandlerOptions()...))
	serveOn(t, s, ln)
	return "http://" + ln.Addr().String()
}

func TestOnePortThreeProtocols(t *testing.T) {
	t.Parallel()
	url := serve(t)
	for name, opts := range map[string][]connect.ClientOption{
		"connect": nil, "connect+json": {connect.WithProtoJSON()},
		"grpc": {connect.WithGRPC()}, "grpcweb": {connect.WithGRPCWeb()},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := agentv1connect.NewAgentServiceClient(NewClient(), url, opts...)
			res, err := c.Status(t.Context(), connect.NewRequest(&agentv1.StatusRequest{}))
			if err != nil || res.Msg.GetStatus().GetName() != "x" {
				t.Fatalf("status: %v %v", res, err)
			}
		})
	}
}

func TestValidationOnEveryRequest(t *testing.T) {
	t.Parallel()
	url := serve(t)
	c := agentv1connect.NewAgentServiceClient(NewClient(), url, connect.WithGRPC())
	_, err := c.CloseSession(t.Context(), connect.NewRequest(&agentv1.CloseSessionRequest{SessionId: "../etc"}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("got %v, want invalid_argument from protovalidate before the handler", err)
	}
}

func TestHealthAndReflection(t *testing.T) {
	t.Parallel()
	url := serve(t)
	hc := grpchealth.NewClient(NewClient(), url, connect.WithGRPC())
	for _, svc := range []string{"", agentv1connect.AgentServiceName} {
		res, err := hc.Check(t.Context(), &grpchealth.CheckRequest{Service: svc})
		if err != nil || res.Status != grpchealth.StatusServing {
			t.Fatalf("health of %q: %v %v", svc, res, err)
		}
	}
	rc := grpcreflect.NewClient(NewClient(), url)
	st := rc.NewStream(t.Context())
	defer st.Close()
	names, err := st.ListServices()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{agentv1connect.AgentServiceName: false, grpchealth.HealthV1ServiceName: false}
	for _, n := range names {
		if _, ok := want[string(n)]; ok {
			want[string(n)] = true
		}
	}
	for n, seen := range want {
		if !seen {
			t.Errorf("reflection does not list %s (lists %v)", n, names)
		}
	}
}

func TestCORSPreflight(t *testing.T) {
	t.Parallel()
	url := serve(t)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodOptions, url+"/codemode.agent.v1.AgentService/Status", nil)
	req.Header.Set("Origin", "http://localhost:5173")
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "content-type,x-grpc-web")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNoContent || res.Header.Get("Access-Control-Allow-Origin") != "http://localhost:5173" {
		t.Fatalf("preflight: %s %v", res.Status, res.Header)
	}
}

// TestCORSPreflightMCP checks that a browser MCP client may use the whole
// streamable HTTP exchange: POST, GET and DELETE with its session header,
// and read the session id the server gives it.
func TestCORSPreflightMCP(t *testing.T) {
	t.Parallel()
	url := serve(t)
	for _, method := range []string{"POST", "GET", "DELETE"} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodOptions, url+"/mcp", nil)
		req.Header.Set("Origin", "http://localhost:6274")
		req.Header.Set("Access-Control-Request-Method", method)
		req.Header.Set("Access-Control-Request-Headers", "authorization,content-type,mcp-session-id,mcp-protocol-version")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		allowed := strings.ToLower(res.Header.Get("Access-Control-Allow-Headers"))
		if res.StatusCode != http.StatusNoContent || !strings.Contains(res.Header.Get("Access-Control-Allow-Methods"), method) ||
			!strings.Contains(allowed, "mcp-session-id") || !strings.Contains(allowed, "mcp-protocol-version") || !strings.Contains(allowed, "authorization") {
			t.Errorf("preflight for %s: %s %v", method, res.Status, res.Header)
		}
		if !strings.Contains(res.Header.Get("Access-Control-Expose-Headers"), "Mcp-Session-Id") {
			t.Errorf("preflight for %s does not expose Mcp-Session-Id: %v", method, res.Header)
		}
	}
}
