package wire

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// Egress connections are carried over the runner's stream as EgressData
// frames (see the runner protocol). Both ends keep a [Tunnels] of them.
const (
	// EgressWindow is how many bytes of one connection a side may send
	// before the other acknowledges them; a side that receives more than
	// this unacknowledged closes the connection.
	EgressWindow = 1 << 20
	// egressChunk is the most data one EgressData frame carries.
	egressChunk = 128 << 10
	// ProxyPort is the port of the HTTP proxy the runner serves on the
	// sandbox's loopback for a run's egress.
	ProxyPort = 3128
)

// ErrTunnelClosed is returned by I/O on a tunnel after it was closed on this
// side.
var ErrTunnelClosed = errors.New("egress connection closed")

// Tunnels keeps the egress connections of one runner stream. Frames that
// arrive for them are passed to [Tunnels.Deliver] and [Tunnels.Closed] by
// the stream's reader, which they never block; frames they send go through
// the functions given to [NewTunnels], which must be safe for concurrent
// use.
type Tunnels struct {
	sendData  func(*runnerv1.EgressData) error
	sendClose func(*runnerv1.EgressClose) error

	mu    sync.Mutex
	conns map[uint64]*Tunnel
}

// NewTunnels returns an empty set of tunnels that sends its frames with
// sendData and sendClose.
func NewTunnels(sendData func(*runnerv1.EgressData) error, sendClose func(*runnerv1.EgressClose) error) *Tunnels {
	return &Tunnels{sendData: sendData, sendClose: sendClose, conns: make(map[uint64]*Tunnel)}
}

// Open adds the connection id, whose far end is addr, and returns it. It
// fails if id is in use.
func (ts *Tunnels) Open(id uint64, local, remote net.Addr) (*Tunnel, error) {
	t := &Tunnel{ts: ts, id: id, local: local, remote: remote}
	t.cond = sync.NewCond(&t.mu)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if _, ok := ts.conns[id]; ok {
		return nil, fmt.Errorf("egress connection %d is already open", id)
	}
	ts.conns[id] = t
	return t, nil
}

func (ts *Tunnels) get(id uint64) *Tunnel {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.conns[id]
}

func (ts *Tunnels) remove(id uint64) {
	ts.mu.Lock()
	delete(ts.conns, id)
	ts.mu.Unlock()
}

// Deliver takes an EgressData frame from the far side. Frames of unknown
// connections (closed here before the far side knew) are dropped.
func (ts *Tunnels) Deliver(d *runnerv1.EgressData) {
	if t := ts.get(d.GetConn()); t != nil {
		t.deliver(d)
	}
}

// Closed takes an EgressClose frame from the far side.
func (ts *Tunnels) Closed(c *runnerv1.EgressClose) {
	if t := ts.get(c.GetConn()); t != nil {
		t.remoteClose(c.GetReason())
	}
}

// CloseAll closes every connection, telling the far side.
func (ts *Tunnels) CloseAll(reason string) {
	ts.mu.Lock()
	all := make([]*Tunnel, 0, len(ts.conns))
	for _, t := range ts.conns {
		all = append(all, t)
	}
	ts.mu.Unlock()
	for _, t := range all {
		t.closeWith(reason)
	}
}

// Len is the number of open connections.
func (ts *Tunnels) Len() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.conns)
}

// Tunnel is one egress connection: a [net.Conn] whose bytes travel in
// EgressData frames. Reads return what the far side sent; writes wait while
// [EgressWindow] bytes are unacknowledged.
type Tunnel struct {
	ts            *Tunnels
	id            uint64
	local, remote net.Addr

	mu   sync.Mutex
	cond *sync.Cond
	buf  [][]byte // received, not yet read, in order
	size int      // bytes in buf
	// unacked is how many bytes were read since the last ack was sent.
	unacked int
	// inflight is how many bytes were sent and not yet acknowledged.
	inflight int
	eof      bool   // the far side will send no more
	closed   bool   // closed on this side, or by the far side
	reason   string // why the far side closed it, if it said
	wrote    bool   // CloseWrite was called
	rdl, wdl deadline
}

// deadline is one direction's deadline; its timer wakes the waiters.
type deadline struct {
	at    time.Time
	timer *time.Timer
}

func (t *Tunnel) deliver(d *runnerv1.EgressData) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	if a := int(min(d.GetAck(), uint64(EgressWindow))); a > 0 {
		t.inflight = max(0, t.inflight-a)
	}
	if n := len(d.GetData()); n > 0 {
		if t.size+n > EgressWindow {
			t.mu.Unlock()
			t.closeWith("peer sent past the window")
			return
		}
		// d is the reader's own, fresh for each frame: no copy.
		t.buf = append(t.buf, d.GetData())
		t.size += n
	}
	if d.GetEof() {
		t.eof = true
	}
	t.cond.Broadcast()
	t.mu.Unlock()
}

func (t *Tunnel) remoteClose(reason string) {
	t.mu.Lock()
	t.closed, t.reason = true, reason
	t.stopTimers()
	t.cond.Broadcast()
	t.mu.Unlock()
	t.ts.remove(t.id)
}

// Read reads what the far side sent. After the far side's half close or
// close it returns the rest, then [io.EOF].
func (t *Tunnel) Read(p []byte) (int, error) {
	t.mu.Lock()
	for t.size == 0 {
		switch {
		case t.eof:
			t.mu.Unlock()
			return 0, io.EOF
		case t.closed:
			t.mu.Unlock()
			return 0, ErrTunnelClosed
		case t.rdl.passed():
			t.mu.Unlock()
			return 0, os.ErrDeadlineExceeded
		}
		t.cond.Wait()
	}
	n := 0
	for n < len(p) && len(t.buf) > 0 {
		k := copy(p[n:], t.buf[0])
		n += k
		if k == len(t.buf[0]) {
			t.buf[0] = nil
			t.buf = t.buf[1:]
		} else {
			t.buf[0] = t.buf[0][k:]
		}
	}
	t.size -= n
	t.unacked += n
	var ack int
	if t.unacked >= EgressWindow/4 || t.size == 0 {
		ack, t.unacked = t.unacked, 0
	}
	closed := t.closed
	t.mu.Unlock()
	if ack > 0 && !closed {
		if err := t.ts.sendData(&runnerv1.EgressData{Conn: t.id, Ack: uint64(ack)}); err != nil {
			t.closeWith("")
		}
	}
	return n, nil
}

// Write sends p to the far side, waiting for acknowledgements as the
// window requires.
func (t *Tunnel) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		t.mu.Lock()
		for {
			if t.closed || t.wrote {
				t.mu.Unlock()
				return written, ErrTunnelClosed
			}
			if t.wdl.passed() {
				t.mu.Unlock()
				return written, os.ErrDeadlineExceeded
			}
			if t.inflight < EgressWindow {
				break
			}
			t.cond.Wait()
		}
		n := min(len(p), egressChunk, EgressWindow-t.inflight)
		t.inflight += n
		t.mu.Unlock()
		if err := t.ts.sendData(&runnerv1.EgressData{Conn: t.id, Data: p[:n]}); err != nil {
			t.closeWith("")
			return written, err
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

// CloseWrite tells the far side that no more data comes (a half close).
func (t *Tunnel) CloseWrite() error {
	t.mu.Lock()
	if t.closed || t.wrote {
		t.mu.Unlock()
		return nil
	}
	t.wrote = true
	t.mu.Unlock()
	return t.ts.sendData(&runnerv1.EgressData{Conn: t.id, Eof: true})
}

// Close closes the connection and tells the far side.
func (t *Tunnel) Close() error {
	t.closeWith("")
	return nil
}

func (t *Tunnel) closeWith(reason string) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	t.stopTimers()
	t.cond.Broadcast()
	t.mu.Unlock()
	t.ts.remove(t.id)
	// The stream may be gone; then so is the far side's end.
	_ = t.ts.sendClose(&runnerv1.EgressClose{Conn: t.id, Reason: reason})
}

// Reason is why the far side closed the connection, if it said.
func (t *Tunnel) Reason() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reason
}

func (t *Tunnel) LocalAddr() net.Addr  { return t.local }
func (t *Tunnel) RemoteAddr() net.Addr { return t.remote }

func (t *Tunnel) SetDeadline(at time.Time) error {
	t.SetReadDeadline(at)
	return t.SetWriteDeadline(at)
}

func (t *Tunnel) SetReadDeadline(at time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rdl.set(at, t.cond)
	return nil
}

func (t *Tunnel) SetWriteDeadline(at time.Time) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.wdl.set(at, t.cond)
	return nil
}

func (t *Tunnel) stopTimers() {
	t.rdl.set(time.Time{}, nil)
	t.wdl.set(time.Time{}, nil)
}

// set changes the deadline; cond's lock is held.
func (d *deadline) set(at time.Time, cond *sync.Cond) {
	if d.timer != nil {
		d.timer.Stop()
		d.timer = nil
	}
	d.at = at
	if at.IsZero() || cond == nil {
		return
	}
	if wait := time.Until(at); wait > 0 {
		d.timer = time.AfterFunc(wait, func() {
			cond.L.Lock()
			cond.Broadcast()
			cond.L.Unlock()
		})
		return
	}
	cond.Broadcast()
}

func (d *deadline) passed() bool { return !d.at.IsZero() && !time.Now().Before(d.at) }

// EgressAddr is the address of an egress connection's far end as a
// [net.Addr] for a [Tunnel]: the host and port the program asked for.
type EgressAddr struct {
	Host string
	Port uint32
}

func (a EgressAddr) Network() string { return "egress" }
func (a EgressAddr) String() string  { return net.JoinHostPort(a.Host, fmt.Sprint(a.Port)) }
