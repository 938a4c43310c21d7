// Package netns makes network namespaces that stand in for hosts in a test:
// each [Host] is a namespace with a loopback and one interface on a bridge
// shared by the hosts of its [Net], and an address in the Net's subnet.
// Processes run inside a host through `ip netns exec` ([Host.Command]); the
// test's own traffic is sent from inside one ([Host.DialContext],
// [Host.Listen]). A link is cut and restored ([Host.Cut], [Host.Restore]), or
// one host is made unreachable from another ([Host.Block]), to partition
// the hosts.
//
// # Sealed off
//
// Nothing of a Net touches a real network. Its bridge lives in a namespace
// of its own, created empty; no namespace has a link to the host's
// interfaces or a default route, only the Net's subnet on its one
// interface. [New] checks that each namespace has only the links and routes
// it made, and every dial and listen checks that the address is on an
// interface of the Net's namespaces before it sends anything.
//
// [New] skips the test where namespaces cannot be made (not root, no `ip`),
// and removes every namespace when the test ends, failed or not.
package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// Net is a bridge and the hosts on it. Safe for concurrent use once its
// hosts are made.
type Net struct {
	tb     testing.TB
	prefix string // of every namespace's name
	subnet netip.Prefix
	bridge string // the bridge's namespace

	mu    sync.Mutex
	hosts []*Host
	next  netip.Addr
}

// Host is a namespace on a Net's bridge.
type Host struct {
	// Name is the host's name in the test.
	Name string
	// NS is the namespace's name (for `ip netns exec`).
	NS string
	// IP is the host's address on the bridge.
	IP netip.Addr

	net  *Net
	port string // the bridge's end of the host's link, in the bridge's namespace
}

// New makes an empty bridge for hosts with addresses in subnet, such as
// "10.231.0.0/24": a private range, which exists only inside the Net's
// namespaces. It skips tb where namespaces cannot be made.
func New(tb testing.TB, subnet string) *Net {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("network namespaces stand in for hosts here, and making them needs root: run the tests as root (make test does)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Skip("network namespaces stand in for hosts here, and making them needs iproute2's ip: run agent/host/setup.sh (make setup)")
	}
	p, err := netip.ParsePrefix(subnet)
	if err != nil || !p.Addr().Is4() || !p.Addr().IsPrivate() || p.Bits() < 16 || p.Bits() > 28 {
		tb.Fatalf("netns: subnet %q: want a private IPv4 range of /16 to /28", subnet)
	}
	var id [4]byte
	_, _ = rand.Read(id[:])
	n := &Net{tb: tb, prefix: "cmt-" + hex.EncodeToString(id[:]) + "-", subnet: p.Masked(), next: p.Masked().Addr().Next()}
	n.bridge = n.prefix + "br"
	tb.Cleanup(n.remove)
	n.ip("netns", "add", n.bridge)
	n.ip("-n", n.bridge, "link", "add", "br0", "type", "bridge")
	n.ip("-n", n.bridge, "link", "set", "br0", "up")
	return n
}

// ip runs ip with args, failing the test when it fails.
func (n *Net) ip(args ...string) string {
	n.tb.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		n.tb.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out)
}

// remove deletes the Net's namespaces, and with them their links.
func (n *Net) remove() {
	n.mu.Lock()
	hosts := slices.Clone(n.hosts)
	n.mu.Unlock()
	for _, h := range hosts {
		_ = exec.Command("ip", "netns", "del", h.NS).Run()
	}
	_ = exec.Command("ip", "netns", "del", n.bridge).Run()
}

// Host makes a host named name (letters and digits, at most 8) on the
// bridge, with the next address of the subnet.
func (n *Net) Host(name string) *Host {
	n.tb.Helper()
	if name == "" || len(name) > 8 || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
		n.tb.Fatalf("netns: host name %q: want 1-8 lower-case letters and digits", name)
	}
	n.mu.Lock()
	ip := n.next
	n.next = n.next.Next()
	h := &Host{Name: name, NS: n.prefix + name, IP: ip, net: n, port: fmt.Sprintf("p%d", len(n.hosts))}
	n.hosts = append(n.hosts, h)
	n.mu.Unlock()
	if !n.subnet.Contains(ip) || ip == lastAddr(n.subnet) {
		n.tb.Fatalf("netns: no address left in %s for %s", n.subnet, name)
	}
	n.ip("netns", "add", h.NS)
	n.ip("-n", h.NS, "link", "set", "lo", "up")
	n.ip("-n", n.bridge, "link", "add", h.port, "type", "veth", "peer", "name", "eth0", "netns", h.NS)
	n.ip("-n", n.bridge, "link", "set", h.port, "master", "br0", "up")
	n.ip("-n", h.NS, "addr", "add", netip.PrefixFrom(ip, n.subnet.Bits()).String(), "dev", "eth0")
	n.ip("-n", h.NS, "link", "set", "eth0", "up")
	h.checkSealed()
	return h
}

// lastAddr is p's broadcast address.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		a[i/8] |= 1 << (7 - i%8)
	}
	return netip.AddrFrom4(a)
}

// checkSealed fails the test unless h has exactly the links lo and eth0,
// eth0 holds only h.IP, and the only route is the subnet's.
func (h *Host) checkSealed() {
	n := h.net
	n.tb.Helper()
	var links []struct {
		Name  string `json:"ifname"`
		Addrs []struct {
			Family string `json:"family"`
			Local  string `json:"local"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(n.ip("-j", "-n", h.NS, "addr", "show")), &links); err != nil {
		n.tb.Fatalf("netns: read %s's links: %v", h.NS, err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Name)
		for _, a := range l.Addrs {
			ok := l.Name == "lo" || (a.Family == "inet" && a.Local == h.IP.String()) || (a.Family == "inet6" && strings.HasPrefix(a.Local, "fe80:"))
			if !ok {
				n.tb.Fatalf("netns: %s has address %s on %s, which it did not make", h.NS, a.Local, l.Name)
			}
		}
	}
	if slices.Sort(names); strings.Join(names, ",") != "eth0,lo" {
		n.tb.Fatalf("netns: %s has links %v, want only lo and eth0", h.NS, names)
	}
	var routes []struct {
		Dst string `json:"dst"`
	}
	if err := json.Unmarshal([]byte(n.ip("-j", "-n", h.NS, "-4", "route", "show", "table", "all")), &routes); err != nil {
		n.tb.Fatalf("netns: read %s's routes: %v", h.NS, err)
	}
	for _, r := range routes {
		if r.Dst == "default" || r.Dst == "0.0.0.0/0" {
			n.tb.Fatalf("netns: %s has a default route", h.NS)
		}
		dst := r.Dst
		if !strings.Contains(dst, "/") {
			dst += "/32"
		}
		p, err := netip.ParsePrefix(dst)
		if err != nil {
			n.tb.Fatalf("netns: %s has a route to %q", h.NS, r.Dst)
		}
		if !n.subnet.Contains(p.Addr()) && !p.Addr().IsLoopback() {
			n.tb.Fatalf("netns: %s routes to %s, outside %s", h.NS, r.Dst, n.subnet)
		}
	}
}

// Addr is h's address with port, as host:port.
func (h *Host) Addr(port int) string {
	return netip.AddrPortFrom(h.IP, uint16(port)).String()
}

// Command is exec.Command of name with args run inside h.
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// check returns an error unless addr (host:port) is the address of one of
// the Net's hosts or a loopback address.
func (n *Net) check(addr string) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return fmt.Errorf("netns: %q is not an IP address and port: only the hosts of the test's own namespaces are reached", addr)
	}
	if ap.Addr().IsLoopback() {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, h := range n.hosts {
		if h.IP == ap.Addr() {
			return nil
		}
	}
	return fmt.Errorf("netns: %s is on no interface of the test's namespaces", ap.Addr())
}

// inside calls f on an OS thread that has entered h's namespace. The thread
// is never used again: it ends with f's goroutine.
func (h *Host) inside(f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // not unlocked: the thread exits with this goroutine
		fd, err := unix.Open("/run/netns/"+h.NS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			done <- fmt.Errorf("netns: open %s: %w", h.NS, err)
			return
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			done <- fmt.Errorf("netns: enter %s: %w", h.NS, err)
			return
		}
		done <- f()
	}()
	return <-done
}

// DialContext dials addr, an address of the Net, from inside h. The socket
// is made in h's namespace, so its traffic never leaves the Net.
func (h *Host) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if err := h.net.check(addr); err != nil {
		return nil, err
	}
	var c net.Conn
	err := h.inside(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens on addr (h's address and a port) inside h.
func (h *Host) Listen(addr string) (net.Listener, error) {
	if err := h.net.check(addr); err != nil {
		return nil, err
	}
	var ln net.Listener
	err := h.inside(func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// Cut takes h's link to the bridge down, as if its cable were pulled: h
// and every other host stop reaching each other, and packets in flight are
// lost, not refused.
func (h *Host) Cut() { h.net.ip("-n", h.net.bridge, "link", "set", h.port, "down") }

// Restore brings h's link to the bridge up again.
func (h *Host) Restore() { h.net.ip("-n", h.net.bridge, "link", "set", h.port, "up") }

// Block makes other unreachable from h: h's packets to it are dropped, and
// its connections to it fail.
func (h *Host) Block(other *Host) {
	h.net.ip("-n", h.NS, "route", "add", "unreachable", other.IP.String()+"/32")
}

// Unblock undoes Block.
func (h *Host) Unblock(other *Host) {
	h.net.ip("-n", h.NS, "route", "del", "unreachable", other.IP.String()+"/32")
}
