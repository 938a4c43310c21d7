package failover

import (
	"context"
	"net"
	"testing"
)

// listen returns a loopback listener that accepts and closes connections,
// and the address of one where nothing listens.
func listen(t *testing.T) (up net.Listener, down string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down = gone.Addr().String()
	gone.Close()
	return ln, down
}

func TestDialerMovesOnOnlyWhenRefusedAndSticks(t *testing.T) {
	t.Parallel()
	up, down := listen(t)
	var d net.Dialer
	var tried []string
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		tried = append(tried, addr)
		return d.DialContext(ctx, network, addr)
	}
	f := New([]string{down, up.Addr().String()}, dial, nil)
	for i := range 2 {
		c, err := f.DialContext(t.Context(), "tcp", "ignored:80")
		if err != nil {
			t.Fatal(err)
		}
		if got := c.RemoteAddr().String(); got != up.Addr().String() {
			t.Fatalf("dial %d reached %s, want %s", i, got, up.Addr())
		}
		c.Close()
	}
	// The first dial tried the refusing address, then the next; the second
	// went straight to the one that accepted.
	want := []string{down, up.Addr().String(), up.Addr().String()}
	if len(tried) != len(want) {
		t.Fatalf("tried %v, want %v", tried, want)
	}
	for i := range want {
		if tried[i] != want[i] {
			t.Fatalf("tried %v, want %v", tried, want)
		}
	}
}

func TestDialerFailsWhenNoneAccepts(t *testing.T) {
	t.Parallel()
	_, down := listen(t)
	var d net.Dialer
	f := New([]string{down, down}, d.DialContext, nil)
	if _, err := f.DialContext(t.Context(), "tcp", "ignored:80"); err == nil {
		t.Fatal("dialed with no address listening")
	}
}
