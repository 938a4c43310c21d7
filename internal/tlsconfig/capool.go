package tlsconfig

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"
)

// CAPool is the CA certificates in a PEM file (a cluster's CA), read again
// when the file changes, so that a rotated CA is trusted without a
// restart: a handshake after ReloadCheck has passed since the last look
// stats the file and reads it if its size or modification time changed.
// A change that does not load (an empty or broken file) keeps the pool in
// use and is logged; the next change is tried again. The file's
// certificates replace the pool's: a CA removed from the file is no longer
// trusted. Put both CAs in the file while services move from one to the
// other.
//
// A CAPool is safe for concurrent use.
type CAPool struct {
	file string
	log  *slog.Logger

	mu      sync.Mutex
	pool    *x509.CertPool
	stamp   fileStamp
	checked time.Time
}

// fileStamp is what says a file changed: the SHA-256 of its content. Its
// size and modification time do not: a CA file replaced by one of the same
// size within the file system's clock tick kept both (TestCAPoolReload).
type fileStamp struct {
	sum [sha256.Size]byte
}

// LoadCAPool reads the PEM certificates in file, which must load now; log
// (nil: none) hears of reloads.
func LoadCAPool(file string, log *slog.Logger) (*CAPool, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &CAPool{file: file, log: log}
	st, err := p.stat()
	if err != nil {
		return nil, err
	}
	pool, err := p.load()
	if err != nil {
		return nil, err
	}
	p.pool, p.stamp, p.checked = pool, st, time.Now()
	return p, nil
}

// Pool returns the pool in use, read again first if ReloadCheck has passed
// since the last look and the file changed. The pool returned is never
// changed afterwards.
func (p *CAPool) Pool() *x509.CertPool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if now.Sub(p.checked) < ReloadCheck {
		return p.pool
	}
	p.checked = now
	st, err := p.stat()
	if err != nil {
		p.log.Warn("look at the CA file; trusting the CAs read before", "error", err)
		return p.pool
	}
	if st == p.stamp {
		return p.pool
	}
	pool, err := p.load()
	if err != nil {
		// Not marked as seen: the next look tries again.
		p.log.Warn("reload the CA file; trusting the CAs read before", "error", err)
		return p.pool
	}
	p.pool, p.stamp = pool, st
	p.log.Info("CA file reloaded", "ca", p.file)
	return pool
}

func (p *CAPool) stat() (fileStamp, error) {
	b, err := os.ReadFile(p.file)
	if err != nil {
		return fileStamp{}, fmt.Errorf("CA certificates: %w", err)
	}
	return fileStamp{sum: sha256.Sum256(b)}, nil
}

func (p *CAPool) load() (*x509.CertPool, error) { return CertPool(p.file) }

// ClientConfig returns the TLS configuration of a connection to
// serverName (a host name or an IP address): TLS 1.2 or later, the peer's
// chain verified against the pool in use at each handshake, and its
// certificate checked for serverName, as crypto/tls checks it with fixed
// RootCAs. (tls.Config.RootCAs is read once per configuration, and
// crypto/tls hands VerifyConnection no server name for an IP address:
// hence a configuration per name.)
func (p *CAPool) ClientConfig(serverName string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		// Verified below, against the current pool and serverName.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return p.verifyServer(serverName, cs.PeerCertificates)
		},
	}
}

// verifyServer checks that certs (the peer's, leaf first) chain to the
// pool in use and that the leaf is for serverName, with the errors
// crypto/tls returns for a fixed pool.
func (p *CAPool) verifyServer(serverName string, certs []*x509.Certificate) error {
	if serverName == "" {
		return errors.New("tls: no server name to verify the certificate against")
	}
	if len(certs) == 0 {
		return errors.New("tls: the server sent no certificate")
	}
	opts := x509.VerifyOptions{Roots: p.Pool(), DNSName: serverName, Intermediates: x509.NewCertPool()}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := certs[0].Verify(opts); err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: certs, Err: err}
	}
	return nil
}

// DialTLSContext returns a dialer of TLS connections for an
// http.Transport (its DialTLSContext): it dials addr with dial, then
// shakes hands as base (nil: none) says, verifying the peer as
// ClientConfig does for addr's host. base is read at each dial, so the
// ALPN protocols a transport adds to it are offered.
func (p *CAPool) DialTLSContext(dial func(ctx context.Context, network, addr string) (net.Conn, error), base func() *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", addr, err)
		}
		cfg := p.ClientConfig(host)
		if b := base(); b != nil {
			c := b.Clone()
			c.ServerName, c.InsecureSkipVerify, c.VerifyConnection, c.RootCAs = cfg.ServerName, true, cfg.VerifyConnection, nil
			c.MinVersion = max(c.MinVersion, cfg.MinVersion)
			cfg = c
		}
		raw, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn := tls.Client(raw, cfg)
		if err := conn.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, err
		}
		return conn, nil
	}
}

// ServerClientCAs makes s, a listener's configuration, ask every client
// for a certificate and verify it against the pool in use at each
// handshake (mutual TLS): tls.Config.ClientCAs is read once per
// configuration, so each handshake gets a copy of s with the current pool.
func (p *CAPool) ServerClientCAs(s *tls.Config) *tls.Config {
	base := s.Clone()
	base.ClientAuth = tls.RequireAndVerifyClientCert
	out := base.Clone()
	out.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.ClientCAs = p.Pool()
		return c, nil
	}
	return out
}
