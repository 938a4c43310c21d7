package netns

import (
	"context"
	"io"
	"os"
	"testing"
	"time"
)

// Two hosts reach each other over the bridge; a cut link or a block stops
// it, and restoring it brings it back. Nothing outside the Net is dialed.
func TestHostsReachEachOtherUntilCut(t *testing.T) {
	t.Parallel()
	n := New(t, "10.231.250.0/24")
	a, b := n.Host("a"), n.Host("b")
	ln, err := b.Listen(b.Addr(7000))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "hello")
			c.Close()
		}
	}()
	reach := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		c, err := a.DialContext(ctx, "tcp", b.Addr(7000))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = io.ReadAll(c)
		return err
	}
	if err := reach(5 * time.Second); err != nil {
		t.Fatalf("a to b: %v", err)
	}
	b.Cut()
	if err := reach(300 * time.Millisecond); err == nil {
		t.Fatal("a reached b over a cut link")
	}
	b.Restore()
	if err := reach(5 * time.Second); err != nil {
		t.Fatalf("a to b after the link is restored: %v", err)
	}
	a.Block(b)
	if err := reach(time.Second); err == nil {
		t.Fatal("a reached b while blocked")
	}
	a.Unblock(b)
	if err := reach(5 * time.Second); err != nil {
		t.Fatalf("a to b after unblocking: %v", err)
	}
}

// Only the Net's hosts and loopback are dialed or listened on.
func TestOnlyItsOwnAddresses(t *testing.T) {
	t.Parallel()
	n := New(t, "10.231.251.0/24")
	a := n.Host("a")
	for _, addr := range []string{"10.231.251.200:80", "example:80"} {
		if c, err := a.DialContext(t.Context(), "tcp", addr); err == nil {
			c.Close()
			t.Errorf("dialed %s, on no interface of the Net", addr)
		}
		if ln, err := a.Listen(addr); err == nil {
			ln.Close()
			t.Errorf("listened on %s, on no interface of the Net", addr)
		}
	}
}

// New removes its namespaces when the test ends.
func TestRemovesItsNamespaces(t *testing.T) {
	t.Parallel()
	var ns []string
	t.Run("make", func(t *testing.T) {
		n := New(t, "10.231.252.0/24")
		ns = []string{n.bridge, n.Host("a").NS}
	})
	for _, name := range ns {
		if _, err := os.Stat("/run/netns/" + name); !os.IsNotExist(err) {
			t.Errorf("namespace %s is still there after its test: %v", name, err)
		}
	}
}
