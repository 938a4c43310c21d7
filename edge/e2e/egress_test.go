package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// Keys of the egress stack's tenants.
const (
	keyEgressAlice = "k-egress-alice-0123456789"
	keyEgressBob   = "k-egress-bob-0123456789ab"
	keyEgressCarol = "k-egress-carol-0123456789"
	keyEgressDave  = "k-egress-dave-0123456789a"
	keyEgressEve   = "k-egress-eve-0123456789ab"
	keyEgressFrank = "k-egress-frank-0123456789"
	keyEgressGrace = "k-egress-grace-0123456789"
)

// egressStack is a stack whose tenants have different egress, and the
// loopback servers their runs try to reach.
type egressStack struct {
	*Stack
	client       edgev1connect.ExecutionServiceClient
	http, https  *httptest.Server
	httpPort     string
	httpsPort    string
	caPEM        []byte
	cpPort, edge string
}

// startEgressStack starts the test servers on 127.0.0.1 (plain HTTP, and
// HTTPS with a certificate for secure.test from a test CA) and a stack whose
// agent resolves the names plain.test and secure.test to 127.0.0.1 (with
// --egress-hosts: nothing asks DNS). Programs name the servers by these
// names, since the sandbox's own loopback addresses bypass the proxy. Its
// tenants are: alice, allowed both names and their address; bob, allowed
// nothing; carol, allowed plain.test by name only; dave, allowed
// plain.test and its address; eve, allowed the HTTP server's address and
// the ports of the agent, the control plane and the edge; frank, allowed
// the HTTP server within tight limits; grace, allowed every name below
// .test and the HTTP server's address. Two request policies run: the
// egress example, which drops grace's wildcard rules and leaves the others
// alone, then a module whose every decision asks for every port of every
// name below .test and of every address, which must widen nobody's egress.
func startEgressStack(t testing.TB) *egressStack {
	t.Helper()
	dockertest.Need(t)
	es := &egressStack{}
	es.startServers(t)

	dir := t.TempDir()
	cpPort, edgePort := freeLoopbackPort(t), freeLoopbackPort(t)
	rule := func(host string, ports ...string) map[string]any {
		return map[string]any{"host": host, "ports": ports}
	}
	egress := map[string]any{
		"tenants": map[string]any{
			"alice": map[string]any{"allow": []any{rule("plain.test", es.httpPort), rule("secure.test", es.httpsPort),
				rule("127.0.0.1", es.httpPort, es.httpsPort)}},
			"carol": map[string]any{"allow": []any{rule("plain.test", es.httpPort)}},
			"dave":  map[string]any{"allow": []any{rule("plain.test", es.httpPort), rule("127.0.0.1", es.httpPort)}},
			"grace": map[string]any{"allow": []any{rule("*.test", es.httpPort), rule("127.0.0.1", es.httpPort)}},
			"frank": map[string]any{"allow": []any{rule("plain.test", es.httpPort), rule("127.0.0.1", es.httpPort)},
				"limits": map[string]any{"connections": 2, "bytes": "100000"}},
		},
	}
	keys := map[string]string{keyEgressAlice: "alice", keyEgressBob: "bob", keyEgressCarol: "carol",
		keyEgressDave: "dave", keyEgressEve: "eve", keyEgressFrank: "frank", keyEgressGrace: "grace"}
	write := func(name string, v any) string {
		b, _ := json.Marshal(v)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keysFile := write("keys.json", keys)

	s := &Stack{AgentName: fmt.Sprintf("e2e-egress-%d", os.Getpid()), Secret: newSecret()}
	t.Cleanup(s.Stop)
	var err error
	s.Agent, err = start("agent", s.ClusterEnv(), "--addr", "127.0.0.1:0", "--name", s.AgentName,
		"--runner", filepath.Join(binDir, "runner"), "--min-active", "2", "--state-dir", "none",
		"--egress-deny", fmt.Sprintf(":%d,:%d", cpPort, edgePort),
		"--egress-hosts", "plain.test=127.0.0.1,secure.test=127.0.0.1,cluster.test=127.0.0.1",
		"--egress-max-connections", "1000") // BenchmarkEgress opens 401
	if err != nil {
		t.Fatal(err)
	}
	_, agentPort, _ := net.SplitHostPort(s.Agent.Addr)
	ports := []string{es.httpPort, agentPort, fmt.Sprint(cpPort), fmt.Sprint(edgePort)}
	egress["tenants"].(map[string]any)["eve"] = map[string]any{"allow": []any{
		rule("cluster.test", ports...), rule("127.0.0.1", ports...)}}
	egressFile := write("egress.json", egress)

	policies := egressPolicies(t, dir, ports, es.httpsPort, write)

	s.ControlPlane, err = start("controlplane", append(s.ClusterEnv(), "REMOTE_HOSTS="+s.Agent.Addr),
		"--addr", fmt.Sprintf("127.0.0.1:%d", cpPort), "--poll-interval", "200ms")
	if err != nil {
		t.Fatal(err)
	}
	s.Edge, err = start("edge", append(s.ClusterEnv(), "CODE_EXECUTION_HOST="+s.ControlPlane.URL()),
		"--addr", fmt.Sprintf("127.0.0.1:%d", edgePort), "--api-keys", keysFile, "--egress", egressFile, "--policy-config", policies,
		"--oidc-config", oidcConfigFor(t, sharedProvider(t), map[string]string{"org-alice": "alice", "org-bob": "bob"}))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.waitAgentHealthy(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	es.Stack = s
	es.cpPort, es.edge = fmt.Sprint(cpPort), fmt.Sprint(edgePort)
	es.client = edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	return es
}

// startServers starts the stack's HTTP and HTTPS servers on loopback, closed
// when the test ends.
func (es *egressStack) startServers(t testing.TB) {
	big := strings.Repeat("x", 200_000)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			io.WriteString(w, big)
		case "/50mb":
			w.Header().Set("Content-Length", fmt.Sprint(50<<20))
			chunk := make([]byte, 1<<20)
			for range 50 {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		default:
			scheme := "http"
			if r.TLS != nil {
				scheme = "https"
			}
			fmt.Fprintf(w, "hello over %s", scheme)
		}
	})
	es.http = httptest.NewServer(handler)
	t.Cleanup(es.http.Close)
	es.https = httptest.NewUnstartedServer(handler)
	var cert tls.Certificate
	cert, es.caPEM = testCertificate(t, "secure.test")
	es.https.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	es.https.StartTLS()
	t.Cleanup(es.https.Close)
	_, es.httpPort, _ = net.SplitHostPort(es.http.Listener.Addr().String())
	_, es.httpsPort, _ = net.SplitHostPort(es.https.Listener.Addr().String())
}

// egressPolicies writes startEgressStack's policy configuration into dir: the
// egress example, then a module that asks for every port of ports and httpsPort
// on every name below .test and every address.
func egressPolicies(t testing.TB, dir string, ports []string, httpsPort string, write func(name string, v any) string) string {
	mods, err := policytest.BuildInto(dir, "egress", "fixed")
	if err != nil {
		t.Fatal(err)
	}
	var allPorts []uint32
	for _, p := range append(ports, httpsPort) {
		allPorts = append(allPorts, uint32(atoi(p)))
	}
	widen, _ := proto.Marshal(&policyv1.RequestDecision{Verdict: policyv1.Verdict_VERDICT_ALLOW, Egress: &executionv1.Egress{
		Allow:  []*executionv1.EgressRule{{Host: "*.test", Ports: allPorts}, {Host: "0.0.0.0/0", Ports: allPorts}, {Host: "::/0", Ports: allPorts}},
		Limits: &executionv1.EgressLimits{Connections: 1000, Bytes: 1 << 40},
	}})
	pol := func(name, module string, order int, config, config64 string) map[string]any {
		path := mods.Path(t, module)
		return map[string]any{"name": name, "path": path, "sha256": policytest.Digest(t, path), "phase": "request",
			"order": order, "config": config, "config_base64": config64}
	}
	return write("policies.json", map[string]any{
		"policies": []any{
			pol("egress", "egress", 10, "grace: no-wildcards", ""),
			pol("widen", "fixed", 20, "", base64.StdEncoding.EncodeToString(widen)),
		},
	})
}

// testCertificate returns a certificate for name signed by a new test CA,
// and the CA's certificate in PEM.
func testCertificate(t testing.TB, name string) (tls.Certificate, []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "codemode test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key},
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

// run runs code as the tenant of key, with the test CA as ca.pem in the
// workspace, and returns the result.
func (es *egressStack) run(t *testing.T, key, lang, code, session string) *executionv1.Result {
	t.Helper()
	req := &edgev1.ExecuteRequest{Language: lang, Code: code, SessionId: session,
		Files: []*executionv1.File{{Path: "ca.pem", Content: es.caPEM}}}
	res, err := es.client.Execute(t.Context(), withKey(req, key))
	if err != nil {
		t.Fatalf("execute %s: %v\n%s", lang, err, es.Logs())
	}
	return res.Msg.GetResult()
}

// fetchers are programs in three languages that GET each of their
// arguments' URLs and print one line per URL: the status and body, or the
// error. They trust the test CA in /workspace/ca.pem.
func fetchers(urls ...string) map[string]struct{ lang, code string } {
	quoted := make([]string, len(urls))
	for i, u := range urls {
		quoted[i] = fmt.Sprintf("%q", u)
	}
	list := strings.Join(quoted, ", ")
	return map[string]struct{ lang, code string }{
		"python requests": {"python", fmt.Sprintf(`
import requests
for u in [%s]:
    try:
        r = requests.get(u, verify="/workspace/ca.pem", timeout=20)
        print(r.status_code, r.text.strip())
    except Exception as e:
        print("error", e)
`, list)},
		"curl": {"bash", fmt.Sprintf(`
for u in %s; do
  out=$(curl -sS --cacert /workspace/ca.pem --max-time 20 "$u" 2>&1); echo "exit=$? $out"
done
`, strings.Join(quoted, " "))},
		// NODE_EXTRA_CA_CERTS is read when Node starts: a child Node
		// trusts the test CA.
		"node fetch": {"javascript", fmt.Sprintf(`
const { execFileSync } = require('child_process');
const inner = 'const urls = ' + JSON.stringify([%s]) + ';' +
  '(async () => { for (const u of urls) { try { const r = await fetch(u); console.log(r.status, (await r.text()).trim()); }' +
  ' catch (e) { console.log("error", e.message, e.cause ? e.cause.message : ""); } } })();';
process.stdout.write(execFileSync('node', ['-e', inner], { env: { ...process.env, NODE_EXTRA_CA_CERTS: '/workspace/ca.pem' } }));
`, list)},
	}
}

// TestEgress is code mode's way out: programs in a sandbox reach what their
// tenant's egress allows through the runner's proxy, and nothing else.
func TestEgress(t *testing.T) {
	t.Parallel()
	es := startEgressStack(t)
	ec := &egressCase{es: es, httpURL: "http://plain.test:" + es.httpPort + "/", httpsURL: "https://secure.test:" + es.httpsPort + "/"}
	t.Run("allowed", ec.allowed)
	t.Run("refused without a rule", ec.refusedWithoutRule)
	t.Run("a name that resolves to loopback", ec.nameResolvingToLoopback)
	t.Run("not the cluster's own ports", ec.notTheClustersOwnPorts)
	t.Run("limits", ec.limits)
	t.Run("a policy narrows", ec.policyNarrows)
	t.Run("a policy cannot widen", ec.policyCannotWiden)
	t.Run("callers cannot set egress", ec.callersCannotSetEgress)
	t.Run("a token is its tenant's egress", ec.tokensAreTheirTenants)
}

// tokensAreTheirTenants: a token of alice reaches what alice's rules
// allow; one of bob, who has none, reaches nothing.
func (ec *egressCase) tokensAreTheirTenants(t *testing.T) {
	p := sharedProvider(t)
	alice, bob := tenantToken(t, p, "org-alice", allScopes...), tenantToken(t, p, "org-bob", allScopes...)
	f := fetchers(ec.httpURL, ec.httpsURL)["curl"]
	if r := ec.es.run(t, alice, f.lang, f.code, ""); !strings.Contains(r.GetStdout(), "hello over http") {
		t.Errorf("alice's token: stdout %q stderr %q, want alice's egress", r.GetStdout(), r.GetStderr())
	}
	if r := ec.es.run(t, bob, f.lang, f.code, ""); strings.Contains(r.GetStdout(), "hello over") || r.GetEgress().GetRefused() != 2 {
		t.Errorf("bob's token reached a server: stdout %q, egress %v", r.GetStdout(), r.GetEgress())
	}
}

// egressCase is TestEgress' stack and the URLs of its servers.
type egressCase struct {
	es                *egressStack
	httpURL, httpsURL string
}

func (ec *egressCase) allowed(t *testing.T) {
	for name, f := range fetchers(ec.httpURL, ec.httpsURL) {
		for _, session := range []string{"", "egress-" + strings.ReplaceAll(name, " ", "-")} {
			mode := "stateless"
			if session != "" {
				mode = "session"
			}
			t.Run(name+" "+mode, func(t *testing.T) {
				r := ec.es.run(t, keyEgressAlice, f.lang, f.code, session)
				for _, want := range []string{"hello over http", "hello over https"} {
					if !strings.Contains(r.GetStdout(), "200 "+want) && !strings.Contains(r.GetStdout(), "exit=0 "+want) {
						t.Errorf("stdout %q lacks %q; stderr %q", r.GetStdout(), want, r.GetStderr())
					}
				}
				if e := r.GetEgress(); e.GetConnections() < 2 || e.GetRefused() != 0 || e.GetBytesReceived() == 0 {
					t.Errorf("egress report %v: want 2 connections or more, none refused, bytes received", e)
				}
			})
		}
	}
}

func (ec *egressCase) refusedWithoutRule(t *testing.T) {
	for name, f := range fetchers(ec.httpURL, ec.httpsURL) {
		t.Run(name, func(t *testing.T) {
			r := ec.es.run(t, keyEgressBob, f.lang, f.code, "")
			if strings.Contains(r.GetStdout(), "hello over") {
				t.Fatalf("a tenant without egress reached a server: %q", r.GetStdout())
			}
			const reason = "may not reach anything outside its sandbox"
			if n := strings.Count(r.GetStderr(), reason); n != 2 {
				t.Errorf("stderr %q: want the reason twice", r.GetStderr())
			}
			if e := r.GetEgress(); e.GetConnections() != 0 || e.GetRefused() != 2 || len(e.GetRefusals()) != 2 ||
				!strings.Contains(e.GetRefusals()[0].GetReason(), reason) {
				t.Errorf("egress report %v: want two refusals", e)
			}
			switch name {
			case "curl":
				// curl prints the body of a refused plain-HTTP request.
				if !strings.Contains(r.GetStdout(), "codemode egress: this run "+reason) {
					t.Errorf("curl's output %q lacks the proxy's reason", r.GetStdout())
				}
			case "python requests":
				// requests shows the status line of a refused CONNECT.
				if !strings.Contains(r.GetStdout(), "403 codemode egress: this run "+reason) {
					t.Errorf("requests' output %q lacks the proxy's reason", r.GetStdout())
				}
			case "node fetch":
				// fetch fails at once with the host and the proxy's reason.
				if !strings.Contains(r.GetStdout(), "codemode egress: secure.test:"+ec.es.httpsPort+" refused: this run "+reason) {
					t.Errorf("fetch's output %q lacks the proxy's reason", r.GetStdout())
				}
			}
		})
	}
}

func (ec *egressCase) nameResolvingToLoopback(t *testing.T) {
	code := fetchers(ec.httpURL)["curl"].code
	r := ec.es.run(t, keyEgressCarol, "bash", code, "")
	want := "plain.test resolves to 127.0.0.1, a loopback address, which only an address rule allows"
	if strings.Contains(r.GetStdout(), "hello over") || !strings.Contains(r.GetStderr(), want) {
		t.Errorf("carol: stdout %q, stderr %q; want refused with %q", r.GetStdout(), r.GetStderr(), want)
	}
	r = ec.es.run(t, keyEgressDave, "bash", code, "")
	if !strings.Contains(r.GetStdout(), "exit=0 hello over http") {
		t.Errorf("dave, whose rules allow the address too: stdout %q, stderr %q", r.GetStdout(), r.GetStderr())
	}
}

func (ec *egressCase) notTheClustersOwnPorts(t *testing.T) {
	_, agentPort, _ := net.SplitHostPort(ec.es.Agent.Addr)
	var urls []string
	for _, p := range []string{agentPort, ec.es.cpPort, ec.es.edge} {
		urls = append(urls, "http://cluster.test:"+p+"/")
	}
	urls = append(urls, "http://cluster.test:"+ec.es.httpPort+"/")
	r := ec.es.run(t, keyEgressEve, "bash", fetchers(urls...)["curl"].code, "")
	if n := strings.Count(r.GetStderr(), "is an address of the cluster itself"); n != 3 {
		t.Errorf("stderr %q: want the agent, control plane and edge refused", r.GetStderr())
	}
	if !strings.Contains(r.GetStdout(), "exit=0 hello over http") {
		t.Errorf("stdout %q: the allowed server was not reached", r.GetStdout())
	}
}

func (ec *egressCase) limits(t *testing.T) {
	// Two connections are allowed; the third is refused. (curl -p
	// opens a tunnel for each request; plain-HTTP requests to one
	// host would share one connection.)
	r := ec.es.run(t, keyEgressFrank, "bash", "for i in 1 2 3; do curl -sS -p "+ec.httpURL+"; echo \" exit=$?\"; done", "")
	if n := strings.Count(r.GetStdout(), "hello over http exit=0"); n != 2 {
		t.Errorf("stdout %q: want two fetches through", r.GetStdout())
	}
	if e := r.GetEgress(); e.GetLimitReached() != executionv1.EgressLimit_EGRESS_LIMIT_CONNECTIONS || e.GetRefused() != 1 ||
		!strings.Contains(r.GetStderr(), "egress limit of 2 connections is reached") {
		t.Errorf("egress report %v, stderr %q: want the connection limit reached", e, r.GetStderr())
	}
	// 200 000 bytes pass the limit of 100 000.
	// (The cut may come before or after the response began: curl
	// sees a short body or the proxy's 502.)
	r = ec.es.run(t, keyEgressFrank, "bash", "curl -sS -o body "+ec.httpURL+"big; echo exit=$? size=$(wc -c < body)", "")
	if e := r.GetEgress(); e.GetLimitReached() != executionv1.EgressLimit_EGRESS_LIMIT_BYTES || e.GetBytesReceived() > 100_000 ||
		strings.Contains(r.GetStdout(), "size=200000") {
		t.Errorf("egress report %v, stdout %q: want the byte limit reached and the download cut", e, r.GetStdout())
	}
}

func (ec *egressCase) policyNarrows(t *testing.T) {
	// grace's "*.test" is dropped by the egress example; its address
	// rule alone lets nothing through by name.
	r := ec.es.run(t, keyEgressGrace, "bash", fetchers(ec.httpURL)["curl"].code, "")
	if strings.Contains(r.GetStdout(), "hello over") || !strings.Contains(r.GetStderr(), "plain.test:"+ec.es.httpPort+" is not in this run's egress allowlist") {
		t.Errorf("grace: stdout %q, stderr %q; want plain.test refused", r.GetStdout(), r.GetStderr())
	}
}

func (ec *egressCase) policyCannotWiden(t *testing.T) {
	// The widening module asked for every name and address on every
	// port in play: bob still reaches nothing, carol still not the
	// address, and frank keeps his limits (checked in "limits").
	r := ec.es.run(t, keyEgressBob, "bash", fetchers(ec.httpURL)["curl"].code, "")
	if strings.Contains(r.GetStdout(), "hello over") {
		t.Errorf("bob reached a server: %q", r.GetStdout())
	}
	r = ec.es.run(t, keyEgressCarol, "bash", fetchers(ec.httpURL)["curl"].code, "")
	if strings.Contains(r.GetStdout(), "hello over") || !strings.Contains(r.GetStderr(), "which only an address rule allows") {
		t.Errorf("carol: stdout %q, stderr %q", r.GetStdout(), r.GetStderr())
	}
}

func (ec *egressCase) callersCannotSetEgress(t *testing.T) {
	// The public request has no egress field: the run gets the
	// tenant's egress only.
	body := `{"language": "bash", "code": "curl -sS ` + ec.httpURL + `", "egress": {"allow": [{"host": "127.0.0.1"}]}}`
	req, _ := http.NewRequest("POST", ec.es.Edge.URL()+"/"+edgev1connect.ExecutionServiceName+"/Execute", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+keyEgressBob)
	res, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || strings.Contains(string(b), "hello over") || !strings.Contains(string(b), "may not reach anything") {
		t.Errorf("got %d %s; want the run refused egress", res.StatusCode, b)
	}
}
