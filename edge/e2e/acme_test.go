package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/tlsconfig"
	"github.com/letsencrypt/challtestsrv"
)

// pebbleValidity is the life of the certificates the test's ACME server
// issues: short, so that the edge renews one within the test (autocert
// renews once two thirds of the life have passed).
const pebbleValidity = 24 * time.Second

// acmeHost is the name the edge gets a certificate for: one of the
// reserved .test names, resolved only by the test's own DNS server.
const acmeHost = "edge.codemode.test"

// startDNS runs a DNS server on loopback (Let's Encrypt's challenge test
// server, as a library) that answers every A query with 127.0.0.1 and no
// AAAA record, and returns its address.
func startDNS(t *testing.T) string {
	t.Helper()
	addr := freeLoopbackAddr(t)
	srv, err := challtestsrv.New(challtestsrv.Config{DNSAddrs: []string{addr}, Log: log.New(io.Discard, "", 0)})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetDefaultDNSIPv4("127.0.0.1")
	srv.SetDefaultDNSIPv6("")
	go srv.Run()
	t.Cleanup(srv.Shutdown)
	return addr
}

// startPebble runs Pebble, a real ACME server (the module's tool), on
// loopback: its directory on one port, its management API on another,
// both over HTTPS with a certificate of ca; its validation authority
// resolves names with the DNS server at dns and answers TLS-ALPN-01
// challenges on tlsPort. It returns the directory URL and a pool with
// Pebble's issuing root.
func startPebble(t *testing.T, ca *tlsconfig.CA, dir, dns string, tlsPort int) (directory string, roots *x509.CertPool) {
	t.Helper()
	bin := buildTool(t, "github.com/letsencrypt/pebble/v2/cmd/pebble")
	is, err := ca.Issue([]string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := is.WriteFiles(dir, "pebble")
	if err != nil {
		t.Fatal(err)
	}
	listen, mgmt := freeLoopbackAddr(t), freeLoopbackAddr(t)
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress": listen, "managementListenAddress": mgmt,
		"certificate": cert, "privateKey": key,
		"httpPort": freeLoopbackPort(t), "tlsPort": tlsPort,
		"externalAccountBindingRequired": false,
		"retryAfter":                     map[string]int{"authz": 1, "order": 1},
		"profiles": map[string]any{"default": map[string]any{
			"description": "short-lived", "validityPeriod": int(pebbleValidity / time.Second)}},
	}}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "pebble.json")
	if err := os.WriteFile(conf, b, 0o644); err != nil {
		t.Fatal(err)
	}
	p := exec.Command(bin, "-config", conf, "-strict=false", "-dnsserver", dns)
	// No random sleeps before validating, no nonces refused on purpose.
	p.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0", "PEBBLE_AUTHZREUSE=0")
	var out strings.Builder
	p.Stdout, p.Stderr = &out, &out
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Process.Kill()
		_ = p.Wait()
		if t.Failed() {
			t.Logf("pebble:\n%s", out.String())
		}
	})
	trust := x509.NewCertPool()
	trust.AddCert(ca.Cert)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: trust}}, Timeout: 5 * time.Second}
	var root []byte
	testkit.WaitFor(t, 30*time.Second, "pebble's issuing root", func() bool {
		res, err := c.Get("https://" + mgmt + "/roots/0")
		if err != nil {
			return false
		}
		defer res.Body.Close()
		root, err = io.ReadAll(res.Body)
		return err == nil && res.StatusCode == http.StatusOK
	})
	roots = x509.NewCertPool()
	if !roots.AppendCertsFromPEM(root) {
		t.Fatalf("pebble's root: %q", root)
	}
	return "https://" + listen + "/dir", roots
}

// An edge given --acme-hosts gets its certificate from a real ACME server
// (Pebble on loopback), answering the TLS-ALPN-01 challenge itself on its
// own port, serves it on every door, keeps it in its cache directory, and
// renews it before it expires, serving the new one to new connections.
func TestEdgeACME(t *testing.T) {
	t.Parallel()
	s := shared(t)
	ca, err := tlsconfig.NewCA("codemode e2e ACME server CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := ca.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	port := freeLoopbackPort(t)
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	directory, roots := startPebble(t, ca, dir, startDNS(t), int(port))
	cache := filepath.Join(dir, "acme")
	// The last --addr wins: the port Pebble validates on.
	edge, err := s.StartEdge(nil, "--addr", addr, "--acme-hosts", acmeHost, "--acme-directory", directory,
		"--acme-directory-ca", filepath.Join(dir, "ca.crt"), "--acme-cache-dir", cache)
	if err != nil {
		t.Fatalf("start edge with ACME: %v", err)
	}
	t.Cleanup(func() { _ = edge.Stop(10 * time.Second) })

	serial := func() (string, time.Time) {
		t.Helper()
		// The name is dialled at the edge's loopback address, never looked up.
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: acmeHost}, ForceAttemptHTTP2: true,
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, addr)
			}}
		defer tr.CloseIdleConnections()
		c := edgev1connect.NewExecutionServiceClient(&http.Client{Transport: tr}, fmt.Sprintf("https://%s:%d", acmeHost, port), connect.WithGRPC())
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		var leaf *x509.Certificate
		tr.TLSClientConfig.VerifyConnection = func(cs tls.ConnectionState) error {
			leaf = cs.PeerCertificates[0]
			return nil
		}
		res, err := c.Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(6*7)"}))
		if err != nil || res.Msg.GetResult().GetStdout() != "42\n" {
			t.Fatalf("execute over the ACME certificate: %v %v\n%s", res, err, edge.Logs())
		}
		return leaf.SerialNumber.String(), leaf.NotAfter
	}
	first, notAfter := serial()
	if life := time.Until(notAfter); life > pebbleValidity+time.Second {
		t.Errorf("certificate valid for %v more, want at most Pebble's %v", life, pebbleValidity)
	}
	if entries, err := os.ReadDir(cache); err != nil || len(entries) < 2 {
		t.Errorf("cache directory: %v %v, want the account key and the certificate", entries, err)
	}
	// autocert renews once two thirds of the life have passed.
	testkit.WaitFor(t, 2*pebbleValidity, "a renewed certificate", func() bool {
		second, _ := serial()
		return second != first
	})
	// A name the edge was not given gets no certificate.
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "other.codemode.test"})
	if err == nil {
		conn.Close()
		t.Errorf("handshake for a name not in --acme-hosts succeeded")
	}
	if !strings.Contains(edge.Logs(), "serving ACME certificate") {
		t.Errorf("the edge did not log the certificates it serves:\n%s", edge.Logs())
	}
}
