package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/tlsconfig"
)

// serveTLS serves "ok" over TLS (h2 and HTTP/1.1) on loopback with a
// certificate of ca for names in dir/name.crt and .key, read again when
// they change, and returns its https:// URL.
func serveTLS(t *testing.T, ca *tlsconfig.CA, dir, name string, names ...string) string {
	t.Helper()
	certFile, keyFile := issue(t, ca, dir, name, names...)
	cfg, err := tlsconfig.Server(tlsconfig.ServerOptions{CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		TLSConfig:         cfg,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0), // the refused handshakes
	}
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return "https://" + ln.Addr().String()
}

// issue writes a certificate of ca for names to dir/name.crt and .key.
func issue(t *testing.T, ca *tlsconfig.CA, dir, name string, names ...string) (certFile, keyFile string) {
	t.Helper()
	is, err := ca.Issue(names, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err = is.WriteFiles(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func newCA(t *testing.T, name string) *tlsconfig.CA {
	t.Helper()
	ca, err := tlsconfig.NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// A service's client trusts the CA in its --cluster-ca file as the file is
// when it connects: after the cluster moves to a new CA (new CA file, new
// service certificates), its new connections reach the services without a
// restart, and the old CA is no longer trusted. Host names are checked as
// before.
func TestClusterCAReloaded(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	oldCA := newCA(t, "old cluster CA")
	if err := oldCA.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	f := cli.NewFlags("test", io.Discard)
	load := LinkFlags(f)
	if err := f.Parse([]string{"--cluster-ca", filepath.Join(dir, "ca.crt")}, func(string) string { return "" }); err != nil {
		t.Fatal(err)
	}
	links, err := load(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	client := links.Client(nil)
	get := func(url string) (issuer string, err error) {
		res, err := client.Get(url)
		if err != nil {
			return "", err
		}
		defer res.Body.Close()
		if b, _ := io.ReadAll(res.Body); string(b) != "ok" || res.StatusCode != http.StatusOK || res.ProtoMajor != 2 {
			t.Fatalf("answer %s %q over %s", res.Status, b, res.Proto)
		}
		return res.TLS.PeerCertificates[0].Issuer.CommonName, nil
	}

	svc := serveTLS(t, oldCA, dir, "svc", "127.0.0.1", "localhost")
	oldSvc := serveTLS(t, oldCA, dir, "old", "127.0.0.1", "localhost")
	if issuer, err := get(svc); err != nil || issuer != "old cluster CA" {
		t.Fatalf("before the rotation: %v, issuer %q", err, issuer)
	}

	// The rotation: a new CA file, then new certificates for the services.
	newCA := newCA(t, "new cluster CA")
	if err := newCA.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	issue(t, newCA, dir, "svc", "127.0.0.1", "localhost")
	client.CloseIdleConnections() // the next call makes a new connection
	var last error
	if !testkit.Until(10*time.Second, func() bool {
		client.CloseIdleConnections()
		issuer, err := get(svc)
		last = err
		return err == nil && issuer == "new cluster CA"
	}) {
		t.Fatalf("after the rotation, the service's new certificate is not trusted: %v", last)
	}

	var unknown x509.UnknownAuthorityError
	if _, err := get(oldSvc); !errors.As(err, &unknown) {
		t.Errorf("a service with a certificate of the old CA: %v, want an unknown-authority error", err)
	}
	var tlsErr *tls.CertificateVerificationError
	if _, err := get(oldSvc); !errors.As(err, &tlsErr) {
		t.Errorf("a service with a certificate of the old CA: %T, want a *tls.CertificateVerificationError", err)
	}
	// A certificate of the new CA for another name is refused, whether the
	// service is reached by IP address or by name.
	other := serveTLS(t, newCA, dir, "other", "other.codemode.test")
	_, port, _ := net.SplitHostPort(other[len("https://"):])
	var wrongHost x509.HostnameError
	for _, url := range []string{other, "https://localhost:" + port} {
		if _, err := get(url); !errors.As(err, &wrongHost) {
			t.Errorf("%s with a certificate for other.codemode.test: %v, want a host-name error", url, err)
		}
	}
}
