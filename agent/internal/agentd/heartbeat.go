package agentd

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	"github.com/codemode-go/codemode/internal/cluster"
)

// advertiseAddr is the address the control planes reach the agent at:
// configured, else the listener's, with the host name in place of an
// unspecified address.
func advertiseAddr(configured, listening string) string {
	if configured != "" {
		return configured
	}
	ap, err := netip.ParseAddrPort(listening)
	if err != nil || !ap.Addr().IsUnspecified() {
		return listening
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		return listening
	}
	return net.JoinHostPort(host, strconv.Itoa(int(ap.Port())))
}

// heartbeat sends the agent's address and status to every control plane
// of the configuration every HeartbeatInterval until ctx is done, then
// once more saying it is not ready, so that they stop routing to it before
// it stops serving. It returns when the last heartbeats are sent.
func (a *Agent) heartbeat(ctx context.Context, addr string) {
	if len(a.cfg.ControlPlanes) == 0 {
		return
	}
	links := a.cfg.Links
	if links == nil {
		links = &cluster.Links{Secret: a.cfg.Secret}
	}
	client := links.Client(nil)
	var wg sync.WaitGroup
	for _, cp := range a.cfg.ControlPlanes {
		c := controlplanev1connect.NewControlPlaneServiceClient(client, links.URL(cp))
		log := a.log.With("component", "heartbeat", "controlplane", cp)
		wg.Go(func() { a.beat(ctx, c, addr, log) })
	}
	wg.Wait()
}

// beat sends heartbeats to one control plane.
func (a *Agent) beat(ctx context.Context, c controlplanev1connect.ControlPlaneServiceClient, addr string, log *slog.Logger) {
	interval := a.cfg.HeartbeatInterval
	send := func(ctx context.Context, leaving bool) error {
		st := a.svc.Status()
		if leaving {
			st = proto.CloneOf(st)
			st.Ready = false
		}
		// Longer than an interval: a heartbeat that arrives late still
		// counts, and the ticker skips the ticks it spans.
		ctx, cancel := context.WithTimeout(ctx, max(interval, 2*time.Second))
		defer cancel()
		_, err := c.Heartbeat(ctx, connect.NewRequest(&cpv1.HeartbeatRequest{Address: addr, Status: st, Interval: durationpb.New(interval)}))
		return err
	}
	joined := false
	var lastErr string
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		err := send(ctx, false)
		switch {
		case err == nil && !joined:
			joined, lastErr = true, ""
			log.Info("joined the control plane", "address", addr)
		case err != nil && ctx.Err() == nil && (joined || err.Error() != lastErr):
			// Logged when it starts failing or fails differently, not at
			// every interval.
			joined, lastErr = false, err.Error()
			log.Warn("heartbeat failed", "address", addr, "error", err)
		}
		select {
		case <-ctx.Done():
			// Even when the last heartbeats failed: one may have arrived.
			if err := send(context.WithoutCancel(ctx), true); err != nil {
				log.Debug("last heartbeat", "error", err)
			}
			return
		case <-tick.C:
		}
	}
}
