// Package tlsconfig builds the TLS configuration of every service's
// listener: a certificate and key read from files and read again when the
// files change, so that a renewed certificate is served without a restart
// and without dropping a connection.
//
// It is the one place that decides TLS versions and ALPN protocols; the one
// place that serves is package server (Server.TLS).
package tlsconfig

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/codemode-go/codemode/internal/cli"
	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"
)

// ReloadCheck is how often, at most, the files are looked at again: a
// handshake after that looks at their size and modification time and
// reads them if either changed.
const ReloadCheck = time.Second

// KeyPair is a certificate and its key, read from files and read again
// when they change. A change that does not load (a certificate written
// before its key, a broken file) keeps the pair in use and is logged; the
// next change is tried again.
type KeyPair struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   stamp
	checked time.Time
}

// stamp is what says a file changed: size and modification time of both.
type stamp struct {
	certSize, keySize int64
	certMod, keyMod   time.Time
}

// LoadKeyPair reads the certificate chain (PEM) in certFile and its key in
// keyFile. They must load now.
func LoadKeyPair(certFile, keyFile string, log *slog.Logger) (*KeyPair, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("want both a certificate file and a key file")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	k := &KeyPair{certFile: certFile, keyFile: keyFile, log: log}
	st, err := k.stat()
	if err != nil {
		return nil, err
	}
	cert, err := k.load()
	if err != nil {
		return nil, err
	}
	k.cert, k.stamp, k.checked = cert, st, time.Now()
	return k, nil
}

// Certificate returns the pair in use, read again first if ReloadCheck has
// passed since the last look and the files changed.
func (k *KeyPair) Certificate() *tls.Certificate {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := time.Now()
	if now.Sub(k.checked) < ReloadCheck {
		return k.cert
	}
	k.checked = now
	st, err := k.stat()
	if err != nil {
		k.log.Warn("look at TLS certificate files; serving the one loaded before", "error", err)
		return k.cert
	}
	if st == k.stamp {
		return k.cert
	}
	cert, err := k.load()
	if err != nil {
		// Not marked as seen: the next look tries again, so that a key
		// written after its certificate is picked up.
		k.log.Warn("reload TLS certificate; serving the one loaded before", "error", err)
		return k.cert
	}
	k.cert, k.stamp = cert, st
	k.log.Info("TLS certificate reloaded", "cert", k.certFile, "subject", cert.Leaf.Subject.String(), "not_after", cert.Leaf.NotAfter)
	return cert
}

func (k *KeyPair) stat() (stamp, error) {
	c, err := os.Stat(k.certFile)
	if err != nil {
		return stamp{}, fmt.Errorf("TLS certificate: %w", err)
	}
	kf, err := os.Stat(k.keyFile)
	if err != nil {
		return stamp{}, fmt.Errorf("TLS key: %w", err)
	}
	return stamp{certSize: c.Size(), keySize: kf.Size(), certMod: c.ModTime(), keyMod: kf.ModTime()}, nil
}

func (k *KeyPair) load() (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate %s and key %s: %w", k.certFile, k.keyFile, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parse TLS certificate %s: %w", k.certFile, err)
		}
	}
	return &cert, nil
}

// ServerOptions say how a service's listener does TLS.
type ServerOptions struct {
	// CertFile and KeyFile are the server's certificate chain and key (PEM),
	// read again when they change.
	CertFile, KeyFile string
	// ClientCA, if set, makes the listener ask every client for a
	// certificate and accept only one that the CAs in it, as they are at
	// the handshake, signed (mutual TLS); nil: clients are not asked.
	ClientCA *CAPool
	Logger   *slog.Logger
}

// Server returns the TLS configuration of a listener: TLS 1.2 or later,
// ALPN h2 then http/1.1 (gRPC needs h2; Connect and gRPC-Web take
// either), the certificate from o's files, and with o.ClientCA, client
// certificates that its CAs signed.
func Server(o ServerOptions) (*tls.Config, error) {
	pair, err := LoadKeyPair(o.CertFile, o.KeyFile, o.Logger)
	if err != nil {
		return nil, err
	}
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return pair.Certificate(), nil
		},
	}
	if o.ClientCA != nil {
		c = o.ClientCA.ServerClientCAs(c)
	}
	return c, nil
}

// CertPool reads the PEM certificates in file into a pool, for a client
// that trusts them (a development CA, say).
func CertPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read CA certificates: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bytes.TrimSpace(b)) {
		return nil, fmt.Errorf("read CA certificates: no PEM certificate in %s", file)
	}
	return pool, nil
}

// Client returns the TLS configuration of a client that trusts only the
// CA certificates in caFile (a cluster's CA): TLS 1.2 or later. The file is
// read once; a client that should trust a rotated CA without a restart
// dials with a CAPool (see CAPool.DialTLSContext, CAPool.ClientConfig).
func Client(caFile string) (*tls.Config, error) {
	pool, err := CertPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool}, nil
}

// Files are a service's --tls-cert and --tls-key: the certificate chain and
// key it serves HTTPS with. Both empty: plain HTTP.
type Files struct {
	Cert, Key string
}

// Flags defines --tls-cert and --tls-key (CODEMODE_TLS_CERT,
// CODEMODE_TLS_KEY) on f; the returned function reads them after f is
// parsed.
func Flags(f *cli.Flags) func() Files {
	cert := f.String("tls-cert", "", "certificate chain (PEM) to serve HTTPS with, read again when it changes (with --tls-key); empty: plain HTTP")
	f.Env("tls-cert", "CODEMODE_TLS_CERT")
	key := f.String("tls-key", "", "key (PEM) of --tls-cert, read again when it changes")
	f.Env("tls-key", "CODEMODE_TLS_KEY")
	return func() Files { return Files{Cert: *cert, Key: *key} }
}

// Server returns the listener's configuration for the files (see Server),
// nil when both are empty.
func (fs Files) Server(log *slog.Logger) (*tls.Config, error) {
	if fs.Cert == "" && fs.Key == "" {
		return nil, nil
	}
	c, err := Server(ServerOptions{CertFile: fs.Cert, KeyFile: fs.Key, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("--tls-cert, --tls-key: %w", err)
	}
	return c, nil
}

// ACMEOptions say how a listener gets its certificates over ACME (RFC 8555)
// from a CA such as Let's Encrypt, answering its TLS-ALPN-01 challenges
// itself: the listener must be what the CA reaches on port 443 of each
// host.
type ACMEOptions struct {
	// Hosts are the names certificates are asked for; a handshake for any
	// other name is refused.
	Hosts []string
	// Directory is the ACME server's directory URL; empty: Let's Encrypt's
	// production directory (autocert's default).
	Directory string
	// DirectoryCA, if set, is a PEM file of the CAs that sign the ACME
	// server's own HTTPS certificate (a private ACME server); empty: the
	// system's roots.
	DirectoryCA string
	// CacheDir keeps the account key and the certificates across restarts
	// (mode 0700); renewals are written there too.
	CacheDir string
	// Email is the account's contact, for the CA's expiry notices; empty:
	// none.
	Email  string
	Logger *slog.Logger
}

// ACME returns the TLS configuration of a listener whose certificates come
// over ACME: asked for on the first handshake naming one of o.Hosts, kept in
// o.CacheDir, and renewed in the background once two thirds of their life
// has passed (autocert's default), each renewed certificate served to new
// connections.
func ACME(o ACMEOptions) (*tls.Config, error) {
	if len(o.Hosts) == 0 {
		return nil, errors.New("ACME: want at least one host name")
	}
	if o.CacheDir == "" {
		return nil, errors.New("ACME: want a cache directory, so that a restart does not ask the CA again")
	}
	client := &acme.Client{DirectoryURL: o.Directory, UserAgent: "codemode"}
	if o.DirectoryCA != "" {
		tc, err := Client(o.DirectoryCA)
		if err != nil {
			return nil, fmt.Errorf("ACME directory CA: %w", err)
		}
		client.HTTPClient = &http.Client{Transport: &http.Transport{TLSClientConfig: tc, Proxy: http.ProxyFromEnvironment}, Timeout: time.Minute}
	}
	m := &autocert.Manager{
		Prompt:     autocert.AcceptTOS,
		HostPolicy: autocert.HostWhitelist(o.Hosts...),
		Cache:      autocert.DirCache(o.CacheDir),
		Email:      o.Email,
		Client:     client,
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var mu sync.Mutex
	served := map[string]string{} // host: serial number last served
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1", acme.ALPNProto},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			c, err := m.GetCertificate(hello)
			if err != nil {
				log.Warn("ACME certificate", "server_name", hello.ServerName, "error", err)
				return nil, err
			}
			if c.Leaf != nil && !slices.Contains(hello.SupportedProtos, acme.ALPNProto) {
				serial := c.Leaf.SerialNumber.String()
				mu.Lock()
				if served[hello.ServerName] != serial {
					served[hello.ServerName] = serial
					log.Info("serving ACME certificate", "server_name", hello.ServerName, "serial", serial, "not_after", c.Leaf.NotAfter)
				}
				mu.Unlock()
			}
			return c, nil
		},
	}, nil
}

// ACMEFlags defines the flags of ACMEOptions on f (--acme-hosts,
// --acme-directory, --acme-directory-ca, --acme-cache-dir, --acme-email,
// each with its CODEMODE_ACME_ variable); the returned function reads them
// after f is parsed. No --acme-hosts: no ACME.
func ACMEFlags(f *cli.Flags) func() ACMEOptions {
	hosts := f.String("acme-hosts", "", "comma-separated host names to get certificates for over ACME (TLS-ALPN-01: the edge must be what the CA reaches on port 443 of each); instead of --tls-cert")
	f.Env("acme-hosts", "CODEMODE_ACME_HOSTS")
	dir := f.String("acme-directory", "", "ACME directory URL; empty: Let's Encrypt's production directory")
	f.Env("acme-directory", "CODEMODE_ACME_DIRECTORY")
	ca := f.String("acme-directory-ca", "", "PEM file of the CAs that sign the ACME server's own HTTPS certificate (a private ACME server); empty: the system's")
	f.Env("acme-directory-ca", "CODEMODE_ACME_DIRECTORY_CA")
	cache := f.String("acme-cache-dir", "", "directory keeping the ACME account key and certificates across restarts; required with --acme-hosts")
	f.Env("acme-cache-dir", "CODEMODE_ACME_CACHE_DIR")
	email := f.String("acme-email", "", "contact address of the ACME account, for the CA's expiry notices")
	f.Env("acme-email", "CODEMODE_ACME_EMAIL")
	return func() ACMEOptions {
		var hs []string
		for _, h := range strings.Split(*hosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				hs = append(hs, h)
			}
		}
		return ACMEOptions{Hosts: hs, Directory: *dir, DirectoryCA: *ca, CacheDir: *cache, Email: *email}
	}
}
