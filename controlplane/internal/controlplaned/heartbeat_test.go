package controlplaned

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/controlplane/internal/router"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
)

// beat sends a's heartbeats for addr to c every interval until the returned
// function is called, which returns when the last heartbeat the control
// plane answered was sent: the control plane received it no earlier.
func beat(t *testing.T, c controlplanev1connect.ControlPlaneServiceClient, a *stubAgent, addr string, interval time.Duration) (stop func() (lastSent time.Time)) {
	t.Helper()
	var last time.Time // written by the sending goroutine only until done
	send := func(ctx context.Context) error {
		sent := time.Now()
		st, err := a.Status(ctx, nil)
		if err != nil {
			return err
		}
		_, err = c.Heartbeat(ctx, connect.NewRequest(&cpv1.HeartbeatRequest{Address: addr, Status: st.Msg.GetStatus(), Interval: durationpb.New(interval)}))
		if err == nil {
			last = sent
		}
		return err
	}
	if err := send(t.Context()); err != nil {
		t.Fatalf("first heartbeat: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = send(ctx)
			}
		}
	}()
	stop = func() time.Time { cancel(); <-done; return last }
	t.Cleanup(func() { stop() })
	return stop
}

func TestAgentsJoinByHeartbeat(t *testing.T) {
	t.Parallel()
	const interval = 250 * time.Millisecond
	c := controlplanev1connect.NewControlPlaneServiceClient(server.NewClient(), startControlPlane(t))
	if _, err := execute(t, c, "", nil); connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("with no agent: got %v, want unavailable", err)
	}

	one := &stubAgent{name: "one"}
	one.free.Store(4)
	two := &stubAgent{name: "two"}
	two.free.Store(4)
	addr1, _ := serveAgent(t, one)
	addr2, _ := serveAgent(t, two)
	stop1 := beat(t, c, one, addr1, interval)
	beat(t, c, two, addr2, interval)

	ran := map[string]int{}
	for range 20 {
		got, err := execute(t, c, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		ran[got]++
	}
	if ran["one"] == 0 || ran["two"] == 0 {
		t.Fatalf("runs went %v, want both registered agents used", ran)
	}
	res, err := c.ListAgents(t.Context(), connect.NewRequest(&cpv1.ListAgentsRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range res.Msg.GetAgents() {
		if !a.GetRegistered() || !a.GetHealthy() {
			t.Fatalf("agent %v: want registered and healthy", a)
		}
	}

	// one stops beating (it still answers): it leaves routing three
	// intervals after its last heartbeat, not at its first failed call.
	// (From the last heartbeat, not from now: under load the last tick
	// may have come late, or not at all.)
	lastBeat := stop1()
	healthy := func(name string) bool {
		res, err := c.ListAgents(t.Context(), connect.NewRequest(&cpv1.ListAgentsRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range res.Msg.GetAgents() {
			if a.GetStatus().GetName() == name {
				return a.GetHealthy()
			}
		}
		return false
	}
	testkit.WaitFor(t, 2*time.Second, "the silent agent is still healthy", func() bool { return !healthy("one") })
	if d := time.Since(lastBeat); d < router.MissedHeartbeats*interval {
		t.Errorf("the agent left routing %v after its last heartbeat, before its heartbeats were missed", d)
	}
	for range 8 {
		if got, err := execute(t, c, "", nil); err != nil || got != "two" {
			t.Fatalf("after one left, a run went to %q (%v), want two", got, err)
		}
	}

	// It comes back.
	beat(t, c, one, addr1, interval)
	testkit.WaitFor(t, 2*time.Second, "the returning agent takes no run", func() bool {
		got, err := execute(t, c, "", nil)
		return err == nil && got == "one"
	})
}

func TestHeartbeatRefusesAnAddressNobodyCanReach(t *testing.T) {
	t.Parallel()
	c := controlplanev1connect.NewControlPlaneServiceClient(server.NewClient(), startControlPlane(t))
	for _, addr := range []string{"0.0.0.0:30031", "[::]:30031", "no-port", ":30031"} {
		_, err := c.Heartbeat(t.Context(), connect.NewRequest(&cpv1.HeartbeatRequest{Address: addr, Status: &agentv1.AgentStatus{Ready: true}}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("address %q: got %v, want invalid_argument", addr, err)
		}
	}
}
