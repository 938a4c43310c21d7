package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"

	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	"github.com/codemode-go/codemode/gen/codemode/agent/v1/agentv1connect"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/cluster"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit/benchbase"
	"github.com/codemode-go/codemode/internal/tlsconfig"
)

// tlsPace is the gap before each run of the TLS part: runs go to the
// two stacks in turns, so each stack gets one every 2*tlsPace.
const tlsPace = 150 * time.Millisecond

// The two stacks of the TLS part.
const (
	stackPlain = "plain"
	stackTLS   = "tls"
)

// tlsResults is what the TLS part measured: print(1) through each stack,
// paced, and fresh connections to each stack's edge.
type tlsResults struct {
	plain, tls stats
	// tcp: a TCP connection to the plain edge; handshake: a TCP
	// connection and a TLS handshake with the TLS edge.
	tcp, handshake stats
	tlsVersion     string // of the handshakes
	load           string // 1-minute load average at the end
}

// tlsEndpoint is one stack of the TLS part as its callers reach it.
type tlsEndpoint struct {
	*stack
	scheme string       // of the edge and the agent
	client *http.Client // trusts the stack's CA, if any; no secret or key
}

func (e tlsEndpoint) edgeURL() string  { return e.scheme + "://" + e.edg.Addr }
func (e tlsEndpoint) agentURL() string { return e.scheme + "://" + e.agent.Addr }

// measureTLS starts two stacks (agent --preload= --min-active 1, a
// control plane, an edge), one plain (h2c on every link) and one with
// certificates of a CA made for the run on every service and every link
// over TLS, the client's too, and runs print(1) through the Connect JSON
// door of each, in turns, one run every tlsPace. Then it times fresh
// connections: TCP to the plain edge against TCP and a TLS handshake with
// the TLS edge, in turns.
func (b *bench) measureTLS(ctx context.Context, res *results) error {
	ca, dir, err := b.writeTLSCA()
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	plain, err := b.upTLSStack(ctx, stackPlain, nil, "")
	if err != nil {
		return err
	}
	defer b.stopStack(plain.stack)
	secured, err := b.upTLSStack(ctx, stackTLS, ca, dir)
	if err != nil {
		return err
	}
	defer b.stopStack(secured.stack)

	out, err := b.printThroughTLS(ctx, plain, secured)
	if err != nil {
		return err
	}
	if err := b.timeConnections(ctx, out, plain, secured, roots); err != nil {
		return err
	}
	out.load = loadAvg()
	res.tls = out
	return nil
}

// writeTLSCA makes the CA of the TLS part and writes it to its own
// directory under the run's, where the TLS stack's certificates go too.
func (b *bench) writeTLSCA() (*tlsconfig.CA, string, error) {
	ca, err := tlsconfig.NewCA("stackbench cluster CA", 24*time.Hour)
	if err != nil {
		return nil, "", err
	}
	dir := filepath.Join(b.dir, "tls")
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, "", err
	}
	if err := ca.WriteFiles(dir); err != nil {
		return nil, "", err
	}
	return ca, dir, nil
}

// printThroughTLS runs print(1) through the Connect JSON door of the plain
// and of the TLS stack, in turns, one run every tlsPace.
func (b *bench) printThroughTLS(ctx context.Context, plain, secured tlsEndpoint) (*tlsResults, error) {
	n := b.o.tlsN
	b.logf("tls: print(1) through both stacks in turns, one run every %s, %d each", tlsPace, n)
	stacks := []tlsEndpoint{plain, secured}
	callers := make([]caller, len(stacks))
	for i, s := range stacks {
		c := edgev1connect.NewExecutionServiceClient(cluster.WithBearer(s.client, b.key), s.edgeURL(), connect.WithProtoJSON())
		callers[i] = edgeCaller{c}
	}
	samples := make([][]sample, len(stacks))
	// Two warm-up runs each, then n measured; the stack that goes first
	// alternates.
	for i := range n + 2 {
		for _, k := range rotation(len(stacks), i%len(stacks)) {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(tlsPace):
			}
			s := timed(ctx, callers[k], jobPrint)
			if i >= 2 {
				samples[k] = append(samples[k], s)
			}
		}
	}
	return &tlsResults{plain: summarize(samples[0], 0), tls: summarize(samples[1], 0)}, nil
}

// timeConnections times fresh connections, in turns: TCP to the plain
// edge against TCP and a TLS handshake, trusting roots, with the TLS edge.
func (b *bench) timeConnections(ctx context.Context, out *tlsResults, plain, secured tlsEndpoint, roots *x509.CertPool) error {
	hn := b.o.handshakeN
	b.logf("tls: %d fresh connections to each edge, in turns", hn)
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	tlsCfg := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12}
	var tcpLat, hsLat []time.Duration
	var tcpFail, hsFail int
	for i := range hn {
		for _, k := range rotation(2, i%2) {
			if err := ctx.Err(); err != nil {
				return err
			}
			t0 := time.Now()
			if k == 0 {
				c, err := dialer.DialContext(ctx, "tcp", plain.edg.Addr)
				d := time.Since(t0)
				if err != nil {
					tcpFail++
					continue
				}
				c.Close()
				tcpLat = append(tcpLat, d)
				continue
			}
			c, err := (&tls.Dialer{NetDialer: dialer, Config: tlsCfg}).DialContext(ctx, "tcp", secured.edg.Addr)
			d := time.Since(t0)
			if err != nil {
				hsFail++
				b.logf("tls: handshake: %v", err)
				continue
			}
			out.tlsVersion = tls.VersionName(c.(*tls.Conn).ConnectionState().Version)
			c.Close()
			hsLat = append(hsLat, d)
		}
	}
	out.tcp, out.handshake = latencyStats(tcpLat, tcpFail), latencyStats(hsLat, hsFail)
	return nil
}

// latencyStats are the percentiles of lat, with fails failures of kind
// transport.
func latencyStats(lat []time.Duration, fails int) stats {
	s := stats{n: len(lat) + fails, errs: map[string]int{}}
	if fails > 0 {
		s.errs[kindTransport] = fails
	}
	s.p50, s.p95, s.p99 = benchbase.Percentile(lat, 50), benchbase.Percentile(lat, 95), benchbase.Percentile(lat, 99)
	return s
}

// upTLSStack starts a stack of the TLS part named kind: an agent with
// --preload= and --min-active 1, a control plane in front of it and an
// edge in front of that; with ca, each serves TLS with a certificate of
// ca for 127.0.0.1 written to dir and calls the others trusting only ca
// (--cluster-ca). It waits until the edge serves and the agent has a warm
// sandbox.
func (b *bench) upTLSStack(ctx context.Context, kind string, ca *tlsconfig.CA, dir string) (tlsEndpoint, error) {
	s := tlsEndpoint{stack: &stack{name: b.name + "-" + kind}, scheme: "http", client: server.NewClient()}
	tlsArgs := func(string) ([]string, error) { return nil, nil }
	if ca != nil {
		s.scheme = "https"
		tr := s.client.Transport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: x509.NewCertPool()}
		tr.TLSClientConfig.RootCAs.AddCert(ca.Cert)
		s.client = &http.Client{Transport: tr}
		tlsArgs = func(service string) ([]string, error) {
			is, err := ca.Issue([]string{"127.0.0.1", "localhost"}, 24*time.Hour)
			if err != nil {
				return nil, err
			}
			cert, key, err := is.WriteFiles(dir, service)
			if err != nil {
				return nil, err
			}
			return []string{"--tls-cert", cert, "--tls-key", key, "--cluster-ca", filepath.Join(dir, "ca.crt")}, nil
		}
	}
	env := []string{"CODEMODE_CLUSTER_SECRET=" + b.secret}
	args, err := tlsArgs("agent")
	if err != nil {
		return s, err
	}
	if s.agent, err = b.start(ctx, "agent", env, b.agentArgs(s.name, append([]string{"--preload=", "--min-active", "1"}, args...)...)...); err != nil {
		return s, err
	}
	if args, err = tlsArgs("controlplane"); err != nil {
		return s, err
	}
	if s.cp, err = b.start(ctx, "controlplane", append(env, "REMOTE_HOSTS="+s.agent.Addr), append([]string{"--addr", "127.0.0.1:0", "--poll-interval", "200ms"}, args...)...); err != nil {
		return s, err
	}
	if args, err = tlsArgs("edge"); err != nil {
		return s, err
	}
	if s.edg, err = b.start(ctx, "edge", append(env, "CODE_EXECUTION_HOST="+s.cp.Addr),
		append([]string{"--addr", "127.0.0.1:0", "--api-keys", filepath.Join(b.dir, "keys.json")}, args...)...); err != nil {
		return s, err
	}
	b.logf("waiting for the %s stack's agent's warm sandbox", kind)
	return s, b.waitTLSStack(ctx, s)
}

// waitTLSStack waits, at most five minutes, until s's edge says an agent
// is ready (GET /status) and its agent has a warm sandbox.
func (b *bench) waitTLSStack(ctx context.Context, s tlsEndpoint) error {
	edge := cluster.WithBearer(s.client, b.key)
	agent := agentv1connect.NewAgentServiceClient(cluster.WithBearer(s.client, b.secret), s.agentURL())
	var last error
	for deadline := time.Now().Add(5 * time.Minute); time.Now().Before(deadline); {
		if err := ctx.Err(); err != nil {
			return err
		}
		last = func() error {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.edgeURL()+"/status", nil)
			res, err := edge.Do(req)
			if err != nil {
				return err
			}
			res.Body.Close()
			if res.StatusCode != http.StatusOK {
				return fmt.Errorf("edge: GET /status: HTTP %d", res.StatusCode)
			}
			st, err := agent.Status(ctx, connect.NewRequest(&agentv1.StatusRequest{}))
			if err != nil {
				return err
			}
			if st.Msg.GetStatus().GetWarm() < 1 {
				return errors.New("agent: no warm sandbox")
			}
			return nil
		}()
		if last == nil {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return fmt.Errorf("the %s stack was not ready within 5 minutes: %w", s.scheme, last)
}

// Bound of the TLS part: print(1) through the stack with TLS on every
// link against the plain one, p50.
const tlsOverPlain = 1.1

// tlsChecks are the Targets of the TLS part; none when it did not run.
func tlsChecks(res *results) []check {
	t := res.tls
	if t == nil || t.plain.p50 == 0 {
		return nil
	}
	return []check{newCheck("tls p50 / plain p50, print(1) paced (TLS on every link)", float64(t.tls.p50)/float64(t.plain.p50), "<=", tlsOverPlain, "x")}
}

var tlsHeader = []string{"stack", "what", "n", "p50 ms", "p95 ms", "p99 ms", "errors"}

// tlsCells is the TLS part's table as text.
func tlsCells(t *tlsResults) [][]string {
	f := func(d time.Duration) string { return fmt.Sprintf("%.2f", ms(d)) }
	r := func(stack, what string, s stats) []string {
		return []string{stack, what, fmt.Sprint(s.n), f(s.p50), f(s.p95), f(s.p99), errText(s.errs)}
	}
	return [][]string{tlsHeader,
		r(stackPlain, "python print(1), paced", t.plain),
		r(stackTLS, "python print(1), paced", t.tls),
		r(stackPlain, "fresh TCP connection to the edge", t.tcp),
		r(stackTLS, "fresh TCP connection and "+t.tlsVersion+" handshake with the edge", t.handshake),
	}
}

// tlsRatios are the ratios of the TLS part, as one line each.
func tlsRatios(t *tlsResults) []string {
	x := func(a, b time.Duration) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", float64(a)/float64(b))
	}
	return []string{
		fmt.Sprintf("print(1), tls / plain: p50 %s, p95 %s, p99 %s", x(t.tls.p50, t.plain.p50), x(t.tls.p95, t.plain.p95), x(t.tls.p99, t.plain.p99)),
		fmt.Sprintf("a fresh connection, TLS handshake included / TCP alone: p50 %s (%.2f ms more)", x(t.handshake.p50, t.tcp.p50), ms(t.handshake.p50-t.tcp.p50)),
		"load average (1 5 15 min) at the end: " + t.load,
	}
}

const tlsLegend = `
Two stacks side by side, each an agent (--preload=, --min-active 1), a control plane and an
edge on loopback: plain, h2c on every link; tls, a certificate of a CA made for the run on
each service, every link over TLS (edge to control plane to agent, --cluster-ca) and the
client to the edge over https (HTTP/2 by ALPN). print(1) through each edge's Connect JSON
door, the stacks in turns, one run every 150 ms (each stack: one every 300 ms), two warm-up
runs each; connections are kept, as clients and services keep them, so the runs' figures
hold no handshake. The handshake rows time fresh connections, opened and closed in turns:
a TCP connection to the plain edge, and a TCP connection plus a full TLS handshake (no
session resumption; ALPN h2, the certificate verified against the CA) with the tls one.
`

// writeTLSText writes the TLS part of the text report.
func writeTLSText(b *strings.Builder, res *results) {
	if res.tls == nil {
		return
	}
	b.WriteString("\nTLS on every link against plain TCP, same run:\n")
	writeText(b, tlsCells(res.tls), func(i int) bool { return i < 2 || i == len(tlsHeader)-1 })
	for _, l := range tlsRatios(res.tls) {
		b.WriteString("  " + l + "\n")
	}
	b.WriteString(tlsLegend)
}

// writeTLSMarkdown writes the TLS part of BENCHMARKS.md.
func writeTLSMarkdown(b *strings.Builder, res *results) {
	if res.tls == nil {
		return
	}
	b.WriteString("\n## TLS on every link\n\nThe same print(1) through a stack with TLS on every link and through a plain one, in turns.\n\n")
	writeMarkdown(b, tlsCells(res.tls))
	b.WriteString("\n")
	for _, l := range tlsRatios(res.tls) {
		b.WriteString("- " + l + "\n")
	}
	b.WriteString(tlsLegend)
}
