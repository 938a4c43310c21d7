package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// look makes p look at its file at the next Pool, as if ReloadCheck had
// passed.
func (p *CAPool) look() {
	p.mu.Lock()
	p.checked = time.Time{}
	p.mu.Unlock()
}

// A CA file replaced is read again, at most every ReloadCheck; a broken
// file keeps the CAs read before until a good one comes.
func TestCAPoolReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a, b := mustCA(t, "a"), mustCA(t, "b")
	if err := a.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "ca.crt")
	p, err := LoadCAPool(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	trusts := func(ca *CA) bool {
		_, err := ca.Cert.Verify(x509.VerifyOptions{Roots: p.Pool()})
		return err == nil
	}
	if !trusts(a) || trusts(b) {
		t.Fatal("pool of a: does not trust a, or trusts b")
	}
	if err := b.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	if trusts(b) {
		t.Error("read the file again within ReloadCheck")
	}
	p.look()
	if !trusts(b) || trusts(a) {
		t.Error("file replaced by b's: does not trust b, or still trusts a")
	}
	if err := os.WriteFile(file, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.look()
	if !trusts(b) {
		t.Error("broken file: dropped the CAs read before")
	}
	if err := os.WriteFile(file, append(append([]byte{}, a.PEM...), b.PEM...), 0o644); err != nil {
		t.Fatal(err)
	}
	p.look()
	if !trusts(a) || !trusts(b) {
		t.Error("file with both CAs: does not trust both")
	}
	if _, err := LoadCAPool(filepath.Join(dir, "none.crt"), nil); err == nil {
		t.Error("missing file loaded")
	}
}

// With ServerOptions.ClientCA (mutual TLS) a listener accepts the client
// certificates of the CA in the file as it is at the handshake: after a
// rotation, a client of the new CA is accepted and one of the old CA, or
// with no certificate, refused.
func TestServerClientCAReloaded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	oldCA, newCA := mustCA(t, "old"), mustCA(t, "new")
	if err := oldCA.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	clientCA, err := LoadCAPool(filepath.Join(dir, "ca.crt"), nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, roots := serveClientCA(t, dir, clientCA)
	dial := func(ca *CA) error { return dialWithCert(t, addr, roots, ca) }
	if err := dial(oldCA); err != nil {
		t.Fatalf("client of the CA in the file: %v", err)
	}
	if err := newCA.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	clientCA.look()
	if err := dial(newCA); err != nil {
		t.Errorf("after the rotation, client of the new CA: %v", err)
	}
	for name, ca := range map[string]*CA{"client of the old CA": oldCA, "client without a certificate": nil} {
		var remote *net.OpError
		if err := dial(ca); !errors.As(err, &remote) || remote.Op != "remote error" {
			t.Errorf("after the rotation, %s: %v, want refused by the server", name, err)
		}
	}
}

// serveClientCA serves TLS on loopback, with a certificate of a CA of its
// own written into dir, to clients with a certificate of clientCA, and
// writes "ok" to each after the handshake. It returns its address and
// the pool of its CA, which clients trust.
func serveClientCA(t *testing.T, dir string, clientCA *CAPool) (addr string, roots *CAPool) {
	srvCA := mustCA(t, "server")
	is, err := srvCA.Issue([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := is.WriteFiles(dir, "server")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Server(ServerOptions{CertFile: certFile, KeyFile: keyFile, ClientCA: clientCA})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
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
			go func() {
				defer c.Close()
				if c.(*tls.Conn).Handshake() == nil {
					c.Write([]byte("ok"))
				}
			}()
		}
	}()
	if err := os.WriteFile(filepath.Join(dir, "srv-ca.crt"), srvCA.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	roots, err = LoadCAPool(filepath.Join(dir, "srv-ca.crt"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return ln.Addr().String(), roots
}

// dialWithCert connects to addr trusting roots, with a certificate of ca
// (nil: none), and reads the server's first bytes.
func dialWithCert(t *testing.T, addr string, roots *CAPool, ca *CA) error {
	c := roots.ClientConfig("127.0.0.1")
	if ca != nil {
		is, err := ca.Issue([]string{"client"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(is.CertPEM, is.KeyPEM)
		if err != nil {
			t.Fatal(err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	conn, err := tls.Dial("tcp", addr, c)
	if err != nil {
		return err
	}
	defer conn.Close()
	// TLS 1.3: the server's verdict on the client's certificate comes
	// with the first read.
	var b [2]byte
	if _, err := conn.Read(b[:]); err != nil {
		return err
	}
	return nil
}

func mustCA(t *testing.T, name string) *CA {
	t.Helper()
	ca, err := NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}
