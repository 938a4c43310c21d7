package wire

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"sync/atomic"
	"testing"
	"time"

	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	"google.golang.org/protobuf/proto"
)

// tunnelPair connects two tunnels back to back; inflight counts the data
// bytes sent and not yet acknowledged, as the far side's window sees them.
func tunnelPair(t *testing.T) (a, b *Tunnel, peak *atomic.Int64) {
	var ta, tb *Tunnels
	peak = new(atomic.Int64)
	var unacked atomic.Int64
	ta = NewTunnels(func(d *runnerv1.EgressData) error {
		if n := unacked.Add(int64(len(d.GetData()))); n > peak.Load() {
			peak.Store(n)
		}
		tb.Deliver(proto.CloneOf(d)) // as a frame would be: a copy
		return nil
	}, func(c *runnerv1.EgressClose) error { tb.Closed(c); return nil })
	tb = NewTunnels(func(d *runnerv1.EgressData) error {
		unacked.Add(-int64(d.GetAck()))
		ta.Deliver(proto.CloneOf(d))
		return nil
	}, func(c *runnerv1.EgressClose) error { ta.Closed(c); return nil })
	a, _ = ta.Open(7, EgressAddr{Host: "a"}, EgressAddr{Host: "b"})
	b, _ = tb.Open(7, EgressAddr{Host: "b"}, EgressAddr{Host: "a"})
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b, peak
}

func TestTunnelCarriesBytesWithinTheWindow(t *testing.T) {
	a, b, peak := tunnelPair(t)
	data := make([]byte, 5*EgressWindow+123)
	rand.Read(data)
	go func() {
		a.Write(data)
		a.CloseWrite()
	}()
	// A slow reader: the writer must wait for acknowledgements.
	var got bytes.Buffer
	buf := make([]byte, 1000)
	for {
		n, err := b.Read(buf)
		got.Write(buf[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("got %d bytes, want the %d sent", got.Len(), len(data))
	}
	if p := peak.Load(); p > EgressWindow {
		t.Errorf("%d bytes were in flight at once, more than the window of %d", p, EgressWindow)
	}
	// After a half close the other direction still works.
	go b.Write([]byte("back"))
	back := make([]byte, 4)
	if _, err := io.ReadFull(a, back); err != nil || string(back) != "back" {
		t.Errorf("after a half close: %q, %v", back, err)
	}
}

func TestTunnelClosesOnAWindowViolation(t *testing.T) {
	var closed atomic.Pointer[runnerv1.EgressClose]
	ts := NewTunnels(func(*runnerv1.EgressData) error { return nil }, func(c *runnerv1.EgressClose) error { closed.Store(c); return nil })
	tn, _ := ts.Open(1, EgressAddr{}, EgressAddr{})
	ts.Deliver(&runnerv1.EgressData{Conn: 1, Data: make([]byte, EgressWindow)})
	ts.Deliver(&runnerv1.EgressData{Conn: 1, Data: []byte{1}})
	if c := closed.Load(); c == nil || c.GetReason() != "peer sent past the window" {
		t.Fatalf("got close %v, want one for the window", c)
	}
	if ts.Len() != 0 {
		t.Error("the tunnel is still listed")
	}
	if _, err := tn.Write([]byte("x")); !errors.Is(err, ErrTunnelClosed) {
		t.Errorf("write after close: %v", err)
	}
}

func TestTunnelDeadlines(t *testing.T) {
	a, b, _ := tunnelPair(t)
	a.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past its deadline: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the deadline woke the read after %v", d)
	}
	// A deadline in the past wakes a blocked read at once (net/http's
	// server does this to abort a background read).
	done := make(chan error, 1)
	a.SetReadDeadline(time.Time{})
	go func() { _, err := a.Read(make([]byte, 1)); done <- err }()
	time.Sleep(20 * time.Millisecond) // let the read block first (it wakes either way)
	a.SetReadDeadline(time.Unix(1, 0))
	if err := <-done; !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read woken by a past deadline: %v", err)
	}
	a.SetReadDeadline(time.Time{})
	b.Write([]byte("z"))
	if n, err := a.Read(make([]byte, 1)); n != 1 || err != nil {
		t.Errorf("read after clearing the deadline: %d, %v", n, err)
	}
	// The far side's close ends a read with an error, not EOF.
	b.Close()
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, ErrTunnelClosed) {
		t.Errorf("read after the far side closed: %v", err)
	}
}
