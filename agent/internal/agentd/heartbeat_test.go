package agentd

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// heartbeats records the heartbeats a control plane receives.
type heartbeats struct {
	controlplanev1connect.UnimplementedControlPlaneServiceHandler
	mu  sync.Mutex
	got []*cpv1.HeartbeatRequest
}

func (h *heartbeats) Heartbeat(_ context.Context, req *connect.Request[cpv1.HeartbeatRequest]) (*connect.Response[cpv1.HeartbeatResponse], error) {
	h.mu.Lock()
	h.got = append(h.got, req.Msg)
	h.mu.Unlock()
	return connect.NewResponse(&cpv1.HeartbeatResponse{}), nil
}

func (h *heartbeats) last() *cpv1.HeartbeatRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.got) == 0 {
		return nil
	}
	return h.got[len(h.got)-1]
}

// serveHeartbeats serves h as a control plane on loopback until the test ends.
func serveHeartbeats(t *testing.T, h *heartbeats) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(slog.New(slog.DiscardHandler))
	srv.HandleService(controlplanev1connect.NewControlPlaneServiceHandler(h, srv.HandlerOptions()...))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ctx, ln) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

func TestHeartbeat(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	h := &heartbeats{}
	cp := serveHeartbeats(t, h)
	a := startAgent(t, func(c *Config) {
		c.ControlPlanes = []string{"http://" + cp}
		c.HeartbeatInterval = 100 * time.Millisecond
		c.Labels = map[string]string{"zone": "a"}
	})
	testkit.Eventually(t, time.Minute, func() error {
		if hb := h.last(); hb == nil || !hb.GetStatus().GetReady() {
			return fmt.Errorf("no heartbeat saying ready; last %v", hb)
		}
		return nil
	})
	hb := h.last()
	st := hb.GetStatus()
	if want := strings.TrimPrefix(a.URL, "http://"); hb.GetAddress() != want {
		t.Errorf("address %q, want the listener's %q", hb.GetAddress(), want)
	}
	if st.GetName() != a.cfg.Name || st.GetLabels()["zone"] != "a" || st.GetCapacity() != 4 || len(st.GetLanguages()) == 0 {
		t.Errorf("status %v: want the agent's name, labels, capacity 4 and languages", st)
	}
	if hb.GetInterval().AsDuration() != 100*time.Millisecond {
		t.Errorf("interval %v, want 100ms", hb.GetInterval().AsDuration())
	}
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	if h.last().GetStatus().GetReady() {
		t.Error("the last heartbeat of a stopping agent says it is ready")
	}
}

func TestAdvertiseAddr(t *testing.T) {
	t.Parallel()
	host, _ := os.Hostname()
	for _, tc := range []struct{ name, configured, listening, want string }{
		{"configured wins", "agent-3.internal:30031", "0.0.0.0:30031", "agent-3.internal:30031"},
		{"loopback listener", "", "127.0.0.1:4000", "127.0.0.1:4000"},
		{"ipv6 listener", "", "[fd00::1]:4000", "[fd00::1]:4000"},
		{"every address", "", "0.0.0.0:4000", net.JoinHostPort(host, "4000")},
		{"every ipv6 address", "", "[::]:4000", net.JoinHostPort(host, "4000")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := advertiseAddr(tc.configured, tc.listening); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestHeartbeatConfig(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cfg, err := ParseConfig([]string{"--runner", "/bin/true", "--state-dir", "none"}, env(map[string]string{
		"CONTROLPLANES": "cp-1:8080, http://cp-2:8080", "ADVERTISE_ADDR": "agent-1:30031", "HEARTBEAT_INTERVAL": "250ms",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.ControlPlanes) != 2 || cfg.ControlPlanes[1] != "http://cp-2:8080" || cfg.AdvertiseAddr != "agent-1:30031" || cfg.HeartbeatInterval != 250*time.Millisecond {
		t.Fatalf("config %+v", cfg)
	}
	for _, args := range [][]string{
		{"--advertise-addr", "0.0.0.0:30031"},
		{"--advertise-addr", "no-port"},
		{"--heartbeat-interval", "1ms"},
	} {
		if _, err := ParseConfig(append([]string{"--runner", "/bin/true", "--state-dir", "none"}, args...), env(nil), io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
