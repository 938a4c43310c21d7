package e2e

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
	"github.com/codemode-go/codemode/internal/tlsconfig"
)

// protoRecorder is a transport that records the HTTP version of each
// response and the serial number of the certificate each served.
type protoRecorder struct {
	rt      http.RoundTripper
	mu      sync.Mutex
	protos  []string
	serials []string
}

func (p *protoRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	res, err := p.rt.RoundTrip(r)
	if err == nil {
		p.mu.Lock()
		p.protos = append(p.protos, res.Proto)
		if res.TLS != nil && len(res.TLS.PeerCertificates) > 0 {
			p.serials = append(p.serials, res.TLS.PeerCertificates[0].SerialNumber.String())
		}
		p.mu.Unlock()
	}
	return res, err
}

func (p *protoRecorder) last() (proto, serial string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.protos) > 0 {
		proto = p.protos[len(p.protos)-1]
	}
	if len(p.serials) > 0 {
		serial = p.serials[len(p.serials)-1]
	}
	return proto, serial
}

// tlsClient trusts pool; h2 offers HTTP/2 by ALPN, else only HTTP/1.1.
func tlsClient(pool *x509.CertPool, h2 bool) (*http.Client, *protoRecorder) {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: h2}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	rec := &protoRecorder{rt: tr}
	return &http.Client{Transport: rec}, rec
}

// tlsEdge is an edge of the shared stack serving TLS with a certificate
// of its own CA.
type tlsEdge struct {
	*Process
	base string // https://ADDR
	ca   *tlsconfig.CA
	pool *x509.CertPool // trusts ca
	dir  string         // of edge.crt and edge.key
}

// startTLSEdge starts a tlsEdge; first is its certificate's serial number.
func startTLSEdge(t *testing.T, s *Stack) (e *tlsEdge, first string) {
	t.Helper()
	ca, err := tlsconfig.NewCA("codemode e2e CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e = &tlsEdge{ca: ca, pool: x509.NewCertPool(), dir: t.TempDir()}
	e.pool.AddCert(ca.Cert)
	cert, key, first := e.issue(t)
	e.Process, err = s.StartEdge(nil, "--tls-cert", cert, "--tls-key", key, "--http-redirect-addr", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("start edge with TLS: %v", err)
	}
	t.Cleanup(func() { _ = e.Stop(30 * time.Second) })
	e.base = "https://" + e.Addr
	return e, first
}

// issue writes a new certificate and key for the edge's files.
func (e *tlsEdge) issue(t *testing.T) (cert, key, serial string) {
	t.Helper()
	is, err := e.ca.Issue([]string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err = is.WriteFiles(e.dir, "edge")
	if err != nil {
		t.Fatal(err)
	}
	c, err := tlsconfig.LoadKeyPair(cert, key, nil)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key, c.Certificate().Leaf.SerialNumber.String()
}

// execute runs print(6*7) through c and the protocol of opts.
func (e *tlsEdge) execute(t *testing.T, c *http.Client, opts ...connect.ClientOption) {
	t.Helper()
	client := edgev1connect.NewExecutionServiceClient(c, e.base, opts...)
	res, err := client.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(6*7)"}))
	if err != nil {
		t.Fatalf("execute: %v\n%s", err, e.Logs())
	}
	if r := res.Msg.GetResult(); r.GetStdout() != "42\n" || r.GetExitCode() != 0 {
		t.Fatalf("result %v, want stdout 42", r)
	}
}

// An edge with --tls-cert and --tls-key serves every door over HTTPS:
// Connect and gRPC over HTTP/2 (ALPN), gRPC-Web and Connect over HTTP/1.1,
// MCP; it refuses plain HTTP and clients that do not trust its CA.
func TestEdgeOverTLS(t *testing.T) {
	t.Parallel()
	e, first := startTLSEdge(t, shared(t))
	h2, h2rec := tlsClient(e.pool, true)
	h1, h1rec := tlsClient(e.pool, false)
	for _, tc := range []struct {
		name  string
		c     *http.Client
		rec   *protoRecorder
		opts  []connect.ClientOption
		proto string
	}{
		{"connect over h2", h2, h2rec, nil, "HTTP/2.0"},
		{"grpc over h2", h2, h2rec, []connect.ClientOption{connect.WithGRPC()}, "HTTP/2.0"},
		{"grpc-web over HTTP/1.1", h1, h1rec, []connect.ClientOption{connect.WithGRPCWeb()}, "HTTP/1.1"},
		{"connect over HTTP/1.1", h1, h1rec, nil, "HTTP/1.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.execute(t, tc.c, tc.opts...)
			if proto, serial := tc.rec.last(); proto != tc.proto || serial != first {
				t.Errorf("answered over %s with certificate %s, want %s with %s", proto, serial, tc.proto, first)
			}
		})
	}
	t.Run("mcp", func(t *testing.T) {
		client := mcp.NewClient(&mcp.Implementation{Name: "e2e-tls", Version: "1"}, nil)
		cs, err := client.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: e.base + "/mcp", HTTPClient: h2}, nil)
		if err != nil {
			t.Fatalf("connect: %v\n%s", err, e.Logs())
		}
		defer cs.Close()
		res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"language": "python", "code": "print(6*7)"}})
		if err != nil || res.IsError || !strings.Contains(testkit.ToolText(res), "42") {
			t.Fatalf("execute_code over TLS: %v %v", err, res)
		}
	})
	t.Run("redirect", func(t *testing.T) { e.redirectsPlainHTTP(t, h2) })
	t.Run("refused", func(t *testing.T) { e.refusesPlainHTTPAndUntrustingClients(t) })
}

// redirectsPlainHTTP checks --http-redirect-addr: plain HTTP there is
// sent to https on the edge's port, path, query and method kept;
// following it with h2 runs the code over TLS.
func (e *tlsEdge) redirectsPlainHTTP(t *testing.T, h2 *http.Client) {
	var addr string
	for _, line := range e.LogLines() {
		var rec struct{ Msg, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "redirecting plain HTTP to https" {
			addr = rec.Addr
		}
	}
	if addr == "" {
		t.Fatalf("the edge logged no redirect listener:\n%s", e.Logs())
	}
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	res, err := noFollow.Post("http://"+addr+"/run?x=1", "application/json", strings.NewReader(`{"code":"print(1)"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if want := e.base + "/run?x=1"; res.StatusCode != http.StatusPermanentRedirect || res.Header.Get("Location") != want {
		t.Fatalf("plain HTTP at the redirect address: HTTP %d to %q, want 308 to %q", res.StatusCode, res.Header.Get("Location"), want)
	}
	h2.CheckRedirect = nil
	res, err = (&http.Client{Transport: h2.Transport}).Post("http://"+addr+"/run", "application/json", strings.NewReader(`{"code":"print(6*7)"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(b), "42") || res.Request.URL.Scheme != "https" {
		t.Fatalf("following the redirect: HTTP %d %s at %s", res.StatusCode, b, res.Request.URL)
	}
}

// refusesPlainHTTPAndUntrustingClients checks that the edge's TLS port
// serves nothing over plain HTTP, nor to a client that does not trust
// its CA.
func (e *tlsEdge) refusesPlainHTTPAndUntrustingClients(t *testing.T) {
	// Plain HTTP to the TLS port: Go's server answers 400 and serves
	// nothing.
	res, err := http.Post("http://"+e.Addr+"/codemode.edge.v1.ExecutionService/Execute", "application/json", strings.NewReader(`{"code":"print(1)"}`))
	if err == nil {
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP to the TLS port: HTTP %d, want 400", res.StatusCode)
		}
	}
	// A client that does not trust the CA.
	untrusting, _ := tlsClient(x509.NewCertPool(), true)
	_, err = untrusting.Get(e.base + "/status")
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Errorf("client without the CA: %v, want an unknown-authority error", err)
	}
}

// A certificate replaced on disk is served to new connections while a
// connection opened before goes on with its own; a broken file keeps the
// certificate in use.
func TestEdgeReloadsItsCertificate(t *testing.T) {
	t.Parallel()
	e, first := startTLSEdge(t, shared(t))
	h2, h2rec := tlsClient(e.pool, true)
	e.execute(t, h2) // an HTTP/2 connection open before the change
	_, _, second := e.issue(t)
	if second == first {
		t.Fatal("same serial twice")
	}
	fresh := func() string {
		c, rec := tlsClient(e.pool, true)
		defer c.CloseIdleConnections()
		e.execute(t, c)
		_, serial := rec.last()
		return serial
	}
	testkit.WaitFor(t, 10*time.Second, "the new certificate on new connections", func() bool { return fresh() == second })
	e.execute(t, h2, connect.WithGRPC())
	if _, serial := h2rec.last(); serial != first {
		t.Errorf("open connection: certificate %s, want %s (the one it began with)", serial, first)
	}
	if err := os.WriteFile(filepath.Join(e.dir, "edge.crt"), []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the broken file logged", func() bool {
		if got := fresh(); got != second {
			t.Fatalf("after a broken certificate file: served %s, want %s", got, second)
		}
		return strings.Contains(e.Logs(), "reload TLS certificate; serving the one loaded before")
	})
}

// With certificates of a cluster CA on every service, every link is TLS:
// the edge calls the control plane over https, the control plane the agent,
// and the agent's heartbeats reach the control plane; a run goes through
// all of them. The internal ports refuse plain HTTP and clients that do
// not trust the CA.
func TestTLSOnEveryLink(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	dir := t.TempDir()
	ca := newClusterCA(t, "codemode e2e cluster CA", dir)
	caFile := filepath.Join(dir, "ca.crt")
	s := &Stack{Secret: newSecret()}
	var err error
	s.ControlPlane, err = start("controlplane", s.ClusterEnv(), append([]string{"--addr", "127.0.0.1:0", "--agents="}, clusterCertArgs(t, ca, dir, "controlplane")...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.ControlPlane.Stop(10 * time.Second) })
	// The control plane as host:port: with --cluster-ca, https.
	startClusterAgentAndEdge(t, s, fmt.Sprintf("e2e-tls-%d", os.Getpid()), s.ControlPlane.Addr, caFile, clusterCertArgs(t, ca, dir, "agent"))

	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL(), connect.WithGRPC())
	testkit.WaitFor(t, 60*time.Second, "a run through TLS links", func() bool {
		res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(6*7)"}))
		return err == nil && res.Msg.GetResult().GetStdout() == "42\n"
	})
	logs := s.Logs()
	for _, want := range []string{`"scheme":"https"`} {
		if strings.Count(logs, want) < 2 {
			t.Errorf("the control plane and the agent do not both serve %s:\n%s", want, logs)
		}
	}
	// The internal ports speak TLS only, and only to who trusts the CA.
	for _, p := range []*Process{s.ControlPlane, s.Agent} {
		internalPortRefuses(t, p, s.Secret)
	}
}

// newClusterCA makes a cluster CA named name and writes it into dir as
// ca.crt.
func newClusterCA(t *testing.T, name, dir string) *tlsconfig.CA {
	t.Helper()
	ca, err := tlsconfig.NewCA(name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	return ca
}

// clusterCertArgs writes into dir a certificate of ca for 127.0.0.1 and
// localhost, and its key, as the service name's, and returns the flags
// that serve them and trust the cluster CA in dir.
func clusterCertArgs(t *testing.T, ca *tlsconfig.CA, dir, name string) []string {
	t.Helper()
	is, err := ca.Issue([]string{"127.0.0.1", "localhost"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := is.WriteFiles(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return []string{"--tls-cert", cert, "--tls-key", key, "--cluster-ca", filepath.Join(dir, "ca.crt")}
}

// startClusterAgentAndEdge starts into s an agent named name, with
// agentTLS and its control plane at cpAddr, and an edge in front of that
// control plane trusting the cluster CA in caFile; both stop when the test
// ends.
func startClusterAgentAndEdge(t *testing.T, s *Stack, name, cpAddr, caFile string, agentTLS []string) {
	t.Helper()
	state, err := os.MkdirTemp(binDir, "agent-state-")
	if err != nil {
		t.Fatal(err)
	}
	s.Agent, err = start("agent", s.ClusterEnv(), append([]string{"--addr", "127.0.0.1:0", "--name", name, "--runner", filepath.Join(binDir, "runner"),
		"--state-dir", state, "--controlplanes", cpAddr, "--heartbeat-interval", "500ms", "--min-active", "1", "--preload="},
		agentTLS...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Agent.Stop(30 * time.Second) })
	s.Edge, err = start("edge", append(s.ClusterEnv(), "CODE_EXECUTION_HOST="+cpAddr), "--addr", "127.0.0.1:0", "--cluster-ca", caFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Edge.Stop(10 * time.Second) })
}

// internalPortRefuses checks that p's port, an internal one, refuses h2c
// with the cluster secret, and a client that does not trust the CA.
func internalPortRefuses(t *testing.T, p *Process, secret string) {
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+p.Addr+"/status", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+secret)
	res, err := httpClient.Do(req)
	if err == nil {
		res.Body.Close()
		if res.StatusCode != http.StatusBadRequest {
			t.Errorf("h2c to %s: HTTP %d, want refused", p.Addr, res.StatusCode)
		}
	}
	untrusting, _ := tlsClient(x509.NewCertPool(), true)
	var unknown x509.UnknownAuthorityError
	if _, err := untrusting.Get("https://" + p.Addr + "/status"); !errors.As(err, &unknown) {
		t.Errorf("client without the CA to %s: %v, want an unknown-authority error", p.Addr, err)
	}
}

// The TLS edge's clients: the playground in Chromium over https (trusting
// the edge's certificate by its key, no other certificate error ignored), the MCP TypeScript
// SDK (NODE_EXTRA_CA_CERTS), and grpcurl with -cacert and buf curl with
// --cacert over gRPC, both finding the method by server reflection.
func TestTLSClients(t *testing.T) {
	t.Parallel()
	e, _ := startTLSEdge(t, shared(t))
	caFile := filepath.Join(e.dir, "ca.crt")
	if err := e.ca.WriteFiles(e.dir); err != nil {
		t.Fatal(err)
	}
	// Chromium matches the key of a certificate the server presents: the
	// edge's own (its chain holds no CA).
	leaf, err := tlsconfig.LoadKeyPair(filepath.Join(e.dir, "edge.crt"), filepath.Join(e.dir, "edge.key"), nil)
	if err != nil {
		t.Fatal(err)
	}
	spki := sha256.Sum256(leaf.Certificate().Leaf.RawSubjectPublicKeyInfo)
	t.Run("chromium", func(t *testing.T) {
		if _, err := os.Stat(chromiumPath); err != nil {
			t.Fatalf("%s is missing: run %s", chromiumPath, webSetup)
		}
		dir := webDir(t, "playwright-core")
		nodeTest(t, dir, "browser.test.mjs", e.base, e.Logs, "CHROMIUM="+chromiumPath,
			"CHROMIUM_TRUST_SPKI="+base64.StdEncoding.EncodeToString(spki[:]),
			"CODEMODE_SCREENSHOT="+filepath.Join(t.TempDir(), "playground.png"))
	})
	t.Run("mcp typescript sdk", func(t *testing.T) {
		dir := webDir(t, "@modelcontextprotocol/sdk")
		nodeTest(t, dir, "tls.test.mjs", e.base, e.Logs, "NODE_EXTRA_CA_CERTS="+caFile)
	})
	t.Run("grpcurl", func(t *testing.T) {
		bin := buildTool(t, "github.com/fullstorydev/grpcurl/cmd/grpcurl")
		out, err := exec.CommandContext(t.Context(), bin, "-cacert", caFile,
			"-d", `{"language":"python","code":"print(6*7)"}`,
			strings.TrimPrefix(e.base, "https://"), "codemode.edge.v1.ExecutionService/Execute").CombinedOutput()
		if err != nil || !strings.Contains(string(out), `"stdout": "42\n"`) {
			t.Fatalf("grpcurl -cacert: %v\n%s", err, out)
		}
	})
	t.Run("buf curl", func(t *testing.T) {
		buf := strings.Fields(os.Getenv("BUF"))
		if len(buf) == 0 {
			buf = []string{"npx", "--yes", "@bufbuild/buf@1.75.0"}
		}
		args := append(buf[1:], "curl", "--protocol", "grpc", "--cacert", caFile,
			"--data", `{"language":"python","code":"print(6*7)"}`, e.base+"/codemode.edge.v1.ExecutionService/Execute")
		out, err := exec.CommandContext(t.Context(), buf[0], args...).CombinedOutput()
		if err != nil || !strings.Contains(string(out), `"stdout": "42\n"`) {
			t.Fatalf("buf curl --cacert: %v\n%s", err, out)
		}
	})
}

// The cluster moves to a new CA while the edge and the agent run: a new
// --cluster-ca file, new certificates for the agent and the control plane,
// and the control plane started again with its new certificate. The edge
// and the agent, not restarted, trust the new CA on their next
// connections: the agent's heartbeats reach the new control plane and a
// run goes through the edge again.
func TestClusterCARotated(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	oldCA := newClusterCA(t, "codemode e2e old cluster CA", dir)
	s := &Stack{Secret: newSecret()}
	cpAddr := freeLoopbackAddr(t)
	startControlPlane := func(ca *tlsconfig.CA) {
		t.Helper()
		var err error
		s.ControlPlane, err = start("controlplane", s.ClusterEnv(), append([]string{"--addr", cpAddr, "--agents="}, clusterCertArgs(t, ca, dir, "controlplane")...)...)
		if err != nil {
			t.Fatal(err)
		}
	}
	startControlPlane(oldCA)
	t.Cleanup(func() { _ = s.ControlPlane.Stop(10 * time.Second) })
	startClusterAgentAndEdge(t, s, fmt.Sprintf("e2e-ca-rotation-%d", os.Getpid()), cpAddr, caFile, clusterCertArgs(t, oldCA, dir, "agent"))
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL(), connect.WithGRPC())
	var last error
	run := func() bool {
		res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(6*7)"}))
		if last = err; err == nil && res.Msg.GetResult().GetStdout() != "42\n" {
			last = fmt.Errorf("result %v", res.Msg.GetResult())
		}
		return last == nil
	}
	if !testkit.Until(60*time.Second, run) {
		t.Fatalf("a run with the old CA: %v\n%s", last, s.Logs())
	}
	edgePid, agentPid := s.Edge.Pid(), s.Agent.Pid()

	newCA := newClusterCA(t, "codemode e2e new cluster CA", dir)
	clusterCertArgs(t, newCA, dir, "agent")
	if err := s.ControlPlane.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	startControlPlane(newCA)
	if !testkit.Until(60*time.Second, run) {
		t.Fatalf("after the rotation, no run through the edge and the agent started before it: %v\n%s", last, s.Logs())
	}
	if s.Edge.Pid() != edgePid || s.Agent.Pid() != agentPid {
		t.Fatal("the edge or the agent was started again")
	}
}
