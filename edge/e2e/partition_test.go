package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
	"github.com/codemode-go/codemode/internal/testkit/launch"
	"github.com/codemode-go/codemode/internal/testkit/netns"
	"github.com/codemode-go/codemode/internal/testkit/redistest"
	"github.com/codemode-go/codemode/internal/tlsconfig"
)

// Ports of the services of a partitioned cluster, each on its own host.
const (
	partEdgePort    = 8000
	partCPPort      = 8080
	partAgentPort   = 30031
	partRedisPort   = 6379
	partWitnessPort = 7000
)

// partitioned is a cluster whose every service runs on a host of its own,
// a network namespace on one bridge, and every link is TLS with a cluster
// CA: Redis, two control planes sharing it, three agents joining both by
// heartbeat (each using the machine's dockerd over its Unix socket), two
// edges, each in front of both control planes in its own order. The test
// speaks from a client host; a witness host counts the runs that reach it
// by path, and tells by the address they come from which agent ran them.
type partitioned struct {
	net    *netns.Net
	secret string
	apiKey string
	pool   *x509.CertPool
	dir    string
	ca     *tlsconfig.CA
	caFile string

	redis, client, witnessHost *netns.Host
	cpHosts, agentHosts        []*netns.Host
	cps, agents, edges         []*Process
	agentOf                    map[string]string // agent name by address
	witness                    *partWitness
}

// partWitness counts requests by path, and keeps who sent them.
type partWitness struct {
	mu   sync.Mutex
	hits map[string][]string // the sender of each request, by path
}

func (w *partWitness) seen(path string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.hits[path]...)
}

func startPartitioned(t *testing.T) *partitioned {
	t.Helper()
	dockertest.Need(t)
	n := netns.New(t, "10.231.7.0/24")
	p := &partitioned{net: n, secret: newSecret(), apiKey: newSecret(), dir: t.TempDir(), agentOf: map[string]string{}}
	var err error
	if p.ca, err = tlsconfig.NewCA("codemode partition CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := p.ca.WriteFiles(p.dir); err != nil {
		t.Fatal(err)
	}
	p.caFile = filepath.Join(p.dir, "ca.crt")
	b, err := os.ReadFile(p.caFile)
	if err != nil {
		t.Fatal(err)
	}
	p.pool = x509.NewCertPool()
	p.pool.AppendCertsFromPEM(b)

	p.redis, p.client, p.witnessHost = n.Host("redis"), n.Host("client"), n.Host("witness")
	p.startWitness(t)
	cert, key := p.issue(t, p.redis)
	rds := redistest.StartTLSOn(t, redistest.TLS{CertFile: cert, KeyFile: key, CAFile: p.caFile}, p.redis, p.redis.IP.String(), partRedisPort)

	var cpURLs []string
	for i := range 2 {
		h := n.Host(fmt.Sprintf("cp%d", i+1))
		p.cpHosts = append(p.cpHosts, h)
		cpURLs = append(cpURLs, "https://"+h.Addr(partCPPort))
		proc := p.start(t, h, "controlplane", []string{"REDIS_URL=" + rds.URL},
			"--addr", h.Addr(partCPPort), "--agents=", "--poll-interval", "200ms")
		p.cps = append(p.cps, proc)
	}
	for i := range 3 {
		h := n.Host(fmt.Sprintf("agent%d", i+1))
		p.agentHosts = append(p.agentHosts, h)
		name := fmt.Sprintf("e2e-part-%d-%d", i+1, os.Getpid())
		p.agentOf[h.IP.String()] = name
		p.agents = append(p.agents, p.start(t, h, "agent", nil, "--addr", h.Addr(partAgentPort), "--name", name,
			"--runner", filepath.Join(binDir, "runner"), "--state-dir", "none",
			"--controlplanes", strings.Join(cpURLs, ","), "--heartbeat-interval", "500ms",
			"--max-sandboxes", "2", "--min-active", "1", "--max-sessions", "2", "--preload=",
			"--egress-hosts", "witness.test="+p.witnessHost.IP.String()))
	}
	keys := p.write(t, "keys.json", map[string]string{p.apiKey: "part"})
	rule := func(host string) map[string]any { return map[string]any{"host": host, "ports": []int{partWitnessPort}} }
	egress := p.write(t, "egress.json", map[string]any{"default": map[string]any{"allow": []any{rule("witness.test"), rule(p.witnessHost.IP.String())}}})
	for i := range 2 {
		h := n.Host(fmt.Sprintf("edge%d", i+1))
		order := []string{cpURLs[i], cpURLs[1-i]}
		p.edges = append(p.edges, p.start(t, h, "edge", []string{"CODE_EXECUTION_HOST=" + strings.Join(order, ",")},
			"--addr", h.Addr(partEdgePort), "--api-keys", keys, "--egress", egress))
	}
	p.waitRouted(t, 3*time.Minute, p.agentNames()...)
	return p
}

// issue writes a certificate of the cluster CA for h's address.
func (p *partitioned) issue(t *testing.T, h *netns.Host) (cert, key string) {
	t.Helper()
	is, err := p.ca.Issue([]string{h.IP.String()}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err = is.WriteFiles(p.dir, h.Name)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func (p *partitioned) write(t *testing.T, name string, v any) string {
	t.Helper()
	b, _ := json.Marshal(v)
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// start starts a service on h with TLS on its port and to its peers, and
// stops it when the test ends.
func (p *partitioned) start(t *testing.T, h *netns.Host, name string, env []string, args ...string) *Process {
	t.Helper()
	cert, key := p.issue(t, h)
	args = append(args, "--tls-cert", cert, "--tls-key", key, "--cluster-ca", p.caFile, "--log-format=json", "--log-level=debug")
	cmd := h.Command(filepath.Join(binDir, name), args...)
	cmd.Env = append(append(os.Environ(), "CODEMODE_CLUSTER_SECRET="+p.secret), env...)
	proc, err := launch.Start(t.Context(), cmd, launch.Options{Name: name + "@" + h.Name, ListenTimeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = proc.Stop(30 * time.Second)
		if t.Failed() {
			t.Logf("%s logs:\n%s", proc.Name, lastLines(proc.Logs(), 60))
		}
	})
	return proc
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (p *partitioned) startWitness(t *testing.T) {
	t.Helper()
	ln, err := p.witnessHost.Listen(p.witnessHost.Addr(partWitnessPort))
	if err != nil {
		t.Fatal(err)
	}
	p.witness = &partWitness{hits: map[string][]string{}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		p.witness.mu.Lock()
		p.witness.hits[r.URL.Path] = append(p.witness.hits[r.URL.Path], host)
		p.witness.mu.Unlock()
		io.WriteString(w, "seen")
	}), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// httpClient is a client on h that trusts the cluster CA and sends
// header bearer (if not empty) as its credential.
func (p *partitioned) httpClient(h *netns.Host, bearer string) *http.Client {
	tr := &http.Transport{DialContext: h.DialContext, TLSClientConfig: &tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2: true, ResponseHeaderTimeout: time.Minute}
	return &http.Client{Transport: authTransport{base: tr, bearer: bearer}}
}

type authTransport struct {
	base   http.RoundTripper
	bearer string
}

func (a authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if a.bearer != "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+a.bearer)
	}
	return a.base.RoundTrip(r)
}

// cpClient calls control plane i directly from the client host, as a
// member of the cluster (the secret and the CA).
func (p *partitioned) cpClient(i int) controlplanev1connect.ControlPlaneServiceClient {
	return controlplanev1connect.NewControlPlaneServiceClient(p.httpClient(p.client, p.secret), "https://"+p.cps[i].Addr)
}

// edgeClient calls edge i from the client host with the API key.
func (p *partitioned) edgeClient(i int, opts ...connect.ClientOption) edgev1connect.ExecutionServiceClient {
	return edgev1connect.NewExecutionServiceClient(p.httpClient(p.client, p.apiKey), "https://"+p.edges[i].Addr, opts...)
}

func (p *partitioned) agentNames() []string {
	var out []string
	for _, a := range p.agentHosts {
		out = append(out, p.agentOf[a.IP.String()])
	}
	return out
}

// routed returns, for control plane i, the agents it routes to.
func (p *partitioned) routed(ctx context.Context, i int) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := p.cpClient(i).ListAgents(ctx, connect.NewRequest(&cpv1.ListAgentsRequest{}))
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, a := range res.Msg.GetAgents() {
		if a.GetHealthy() && a.GetRegistered() {
			out[a.GetStatus().GetName()] = true
		}
	}
	return out, nil
}

// waitRouted waits until both control planes route to every agent of want.
func (p *partitioned) waitRouted(t *testing.T, d time.Duration, want ...string) {
	t.Helper()
	testkit.Eventually(t, d, func() error {
		for i := range p.cps {
			got, err := p.routed(t.Context(), i)
			if err != nil {
				return err
			}
			for _, name := range want {
				if !got[name] {
					return fmt.Errorf("control plane %d routes to %v, want %v", i+1, got, want)
				}
			}
		}
		return nil
	})
}

// witnessed is code that tells the witness it runs, under path, sleeps for
// pause, then prints done.
func (p *partitioned) witnessed(path string, pause time.Duration) string {
	return fmt.Sprintf("import time, urllib.request\n"+
		"urllib.request.urlopen('http://witness.test:%d%s', timeout=10).read()\n"+
		"time.sleep(%g)\nprint('done')\n", partWitnessPort, path, pause.Seconds())
}

// ranOn returns the agent that ran path's run once, or an error when it
// ran on none or more than once.
func (p *partitioned) ranOn(path string) (string, error) {
	seen := p.witness.seen(path)
	if len(seen) != 1 {
		return "", fmt.Errorf("run %s reached the witness %d times (from %v), want once", path, len(seen), seen)
	}
	return p.agentOf[seen[0]], nil
}

// partDoor runs code through one of the edges' doors and returns its output.
type partDoor struct {
	name string
	run  func(ctx context.Context, p *partitioned, edge int, code string) (string, error)
}

func connectDoor(name string, opts ...connect.ClientOption) partDoor {
	return partDoor{name, func(ctx context.Context, p *partitioned, edge int, code string) (string, error) {
		res, err := p.edgeClient(edge, opts...).Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: code}))
		if err != nil {
			return "", err
		}
		return res.Msg.GetResult().GetStdout(), nil
	}}
}

var partitionDoors = []partDoor{
	connectDoor("connect"),
	connectDoor("grpc", connect.WithGRPC()),
	connectDoor("grpc-web", connect.WithGRPCWeb()),
	{"mcp", func(ctx context.Context, p *partitioned, edge int, code string) (string, error) {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-partition", Version: "1"}, nil).Connect(ctx,
			&mcp.StreamableClientTransport{Endpoint: "https://" + p.edges[edge].Addr + "/mcp", HTTPClient: p.httpClient(p.client, p.apiKey)}, nil)
		if err != nil {
			return "", err
		}
		defer cs.Close()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"language": "python", "code": code}})
		if err != nil {
			return "", err
		}
		if res.IsError {
			return "", errors.New(testkit.ToolText(res))
		}
		sc, _ := res.StructuredContent.(map[string]any)
		out, _ := sc["stdout"].(string)
		return out, nil
	}},
	{"run", func(ctx context.Context, p *partitioned, edge int, code string) (string, error) {
		body, _ := json.Marshal(map[string]string{"language": "python", "code": code})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+p.edges[edge].Addr+"/run", strings.NewReader(string(body)))
		if err != nil {
			return "", err
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := p.httpClient(p.client, p.apiKey).Do(req)
		if err != nil {
			return "", err
		}
		defer res.Body.Close()
		var out struct{ Output, Error string }
		if err := json.NewDecoder(res.Body).Decode(&out); err != nil || res.StatusCode != http.StatusOK {
			return "", fmt.Errorf("HTTP %d %q: %v", res.StatusCode, out.Error, err)
		}
		return out.Output, nil
	}},
}

// TestPartitions runs a cluster across hosts made of network namespaces,
// over TLS on every link, and partitions it.
func TestPartitions(t *testing.T) {
	t.Parallel()
	p := startPartitioned(t)
	agents := p.agentNames()

	t.Run("every door reaches every agent", func(t *testing.T) { p.everyDoorReachesEveryAgent(t, agents) })

	// Sessions, one on each agent as far as placement gives them, each
	// holding x.
	sessions := p.sessionOnEachAgent(t, agents)
	victimIdx := -1
	var victim string
	for i, name := range agents {
		if sessions[name] != "" {
			victimIdx, victim = i, name
			break
		}
	}
	if victimIdx < 0 {
		t.Fatal("no session was placed")
	}
	lostSession := sessions[victim]

	t.Run("a cut agent", func(t *testing.T) { p.cutAgent(t, victimIdx, victim, lostSession) })
	t.Run("a control plane cut from redis", func(t *testing.T) { p.controlPlaneCutFromRedis(t, sessions, victim) })
	t.Run("a stranger on the bridge", func(t *testing.T) {
		stranger := p.net.Host("stranger")
		p.strangerIsRefused(t, stranger)
	})
}

// everyDoorReachesEveryAgent runs through every door, through both edges in
// turns, until each of agents has run one.
func (p *partitioned) everyDoorReachesEveryAgent(t *testing.T, agents []string) {
	for _, d := range partitionDoors {
		reached := map[string]bool{}
		for i := 0; len(reached) < len(agents); i++ {
			if i == 30 {
				t.Fatalf("%s: 30 runs reached only %v of %v", d.name, reached, agents)
			}
			path := fmt.Sprintf("/doors/%s/%d", d.name, i)
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			out, err := d.run(ctx, p, i%2, p.witnessed(path, 0))
			cancel()
			if err != nil || out != "done\n" {
				t.Fatalf("%s through edge %d: %q, %v", d.name, i%2+1, out, err)
			}
			a, err := p.ranOn(path)
			if err != nil {
				t.Fatal(err)
			}
			reached[a] = true
		}
	}
}

// sessionOnEachAgent opens sessions through the first edge, at most 12,
// until one is on each of agents, sets x = 41 in each, and closes those
// that landed on an agent that has one already. It returns the session
// ids by agent.
func (p *partitioned) sessionOnEachAgent(t *testing.T, agents []string) map[string]string {
	edge := p.edgeClient(0)
	sessions := map[string]string{} // session id by agent
	for i := 0; len(sessions) < len(agents) && i < 12; i++ {
		res, err := edge.CreateSession(t.Context(), connect.NewRequest(&edgev1.CreateSessionRequest{Language: "python"}))
		if err != nil {
			t.Fatal(err)
		}
		id := res.Msg.GetSession().GetId()
		path := "/session/" + id
		if out, err := p.runIn(t.Context(), id, "x = 41\n"+p.witnessed(path, 0)); err != nil || out != "done\n" {
			t.Fatalf("session %s: %q, %v", id, out, err)
		}
		a, err := p.ranOn(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := sessions[a]; !ok {
			sessions[a] = id
		} else {
			_, _ = edge.CloseSession(t.Context(), connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: id}))
		}
	}
	return sessions
}

// cutAgent cuts the link of the agent victim, the victimIdx-th, while a
// cell of its session lostSession is in flight, then restores it.
func (p *partitioned) cutAgent(t *testing.T, victimIdx int, victim, lostSession string) {
	// A session cell is running on the victim when its link is cut.
	inFlight := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
		defer cancel()
		_, err := p.runIn(ctx, lostSession, p.witnessed("/cut/in-flight", 3*time.Second))
		inFlight <- err
	}()
	testkit.WaitFor(t, 30*time.Second, "the cell in flight to reach the witness", func() bool {
		return len(p.witness.seen("/cut/in-flight")) > 0
	})
	p.agentHosts[victimIdx].Cut()
	cut := time.Now()
	p.cutAgentLeavesRouting(t, victim, cut)
	// New runs go to the others, through both edges, and each runs once.
	for i := range 12 {
		path := fmt.Sprintf("/cut/stateless/%d", i)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		out, err := partitionDoors[0].run(ctx, p, i%2, p.witnessed(path, 0))
		cancel()
		if err != nil || out != "done\n" {
			t.Fatalf("a run after the cut: %q, %v", out, err)
		}
		if a, err := p.ranOn(path); err != nil || a == victim {
			t.Fatalf("a run after the cut ran on %s (%v)", a, err)
		}
	}
	p.cellInFlightEnds(t, inFlight, cut)
	// The session on the cut agent answers unavailable or lost, from
	// every edge and both control planes' view, never a new empty
	// kernel.
	for i := range p.edges {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		out, err := p.runInVia(ctx, i, lostSession, "print(x)")
		cancel()
		checkNotReborn(t, fmt.Sprintf("edge %d, link cut", i+1), out, err)
	}
	p.restoreAgent(t, victimIdx, victim, lostSession)
}

// cutAgentLeavesRouting checks that both control planes stop routing to
// the agent victim, whose link was cut at cut, within the bound of three
// missed heartbeats and a margin.
func (p *partitioned) cutAgentLeavesRouting(t *testing.T, victim string, cut time.Time) {
	const leaveBound = 5 * time.Second
	testkit.Eventually(t, 30*time.Second, func() error {
		for i := range p.cps {
			got, err := p.routed(t.Context(), i)
			if err != nil || got[victim] {
				return fmt.Errorf("control plane %d routes to %v (%v)", i+1, got, err)
			}
		}
		return nil
	})
	left := time.Since(cut)
	t.Logf("the cut agent left routing %v after its link went down", left.Round(time.Millisecond))
	if left > leaveBound {
		t.Errorf("the cut agent left routing after %v, want within %v", left, leaveBound)
	}
}

// cellInFlightEnds checks that the cell in flight on the agent cut at cut
// ends, with an error, once the control plane's keep-alive gives up on
// the link (15 s), and ran once.
func (p *partitioned) cellInFlightEnds(t *testing.T, inFlight <-chan error, cut time.Time) {
	select {
	case err := <-inFlight:
		if err == nil {
			t.Error("the cell in flight on the cut agent succeeded")
		}
		t.Logf("the cell in flight on the cut agent ended %v after the cut: %v", time.Since(cut).Round(time.Millisecond), err)
	case <-time.After(30 * time.Second):
		t.Fatal("the cell in flight on the cut agent did not end within 30 s")
	}
	if n := len(p.witness.seen("/cut/in-flight")); n != 1 {
		t.Errorf("the cell in flight ran %d times, want once", n)
	}
}

// restoreAgent restores the link of the agent victim, the victimIdx-th:
// it comes back into routing and takes runs, and its session lostSession
// is x as it was, or lost; never an empty kernel.
func (p *partitioned) restoreAgent(t *testing.T, victimIdx int, victim, lostSession string) {
	p.agentHosts[victimIdx].Restore()
	restored := time.Now()
	p.waitRouted(t, time.Minute, victim)
	t.Logf("the agent was routed again %v after its link came back", time.Since(restored).Round(time.Millisecond))
	back := false
	for i := 0; i < 30 && !back; i++ {
		path := fmt.Sprintf("/restored/%d", i)
		out, err := partitionDoors[0].run(t.Context(), p, i%2, p.witnessed(path, 0))
		if err != nil || out != "done\n" {
			t.Fatalf("a run after the restore: %q, %v", out, err)
		}
		a, err := p.ranOn(path)
		if err != nil {
			t.Fatal(err)
		}
		back = a == victim
	}
	if !back {
		t.Fatalf("30 runs after the restore, none on %s", victim)
	}
	out, err := p.runIn(t.Context(), lostSession, "print(x)")
	if err == nil && out != "41\n" {
		t.Fatalf("the session after the restore printed %q, want 41 or not_found", out)
	}
	checkNotReborn(t, "after the restore", out, err)
	t.Logf("the session on the agent whose link came back: %q, %v", out, err)
}

// controlPlaneCutFromRedis cuts the first control plane from redis: a
// session not on the agent victim fails there, unavailable, while its
// stateless runs go on and sessions carry on through both edges.
func (p *partitioned) controlPlaneCutFromRedis(t *testing.T, sessions map[string]string, victim string) {
	cp1 := p.cpHosts[0]
	cp1.Block(p.redis)
	defer cp1.Unblock(p.redis)
	var kept string
	for name, id := range sessions {
		if name != victim {
			kept = id
			break
		}
	}
	// Its session calls fail unavailable: it cannot know the session.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	_, err := p.cpClient(0).Execute(ctx, connect.NewRequest(&cpv1.ExecuteRequest{
		Execution: &executionv1.Execution{Language: "python", Code: "print(x)", SessionId: kept}, Tenant: "part"}))
	cancel()
	if connect.CodeOf(err) != connect.CodeUnavailable {
		t.Fatalf("a session call at the control plane cut from redis: %v, want unavailable", err)
	}
	// Its stateless runs go on.
	ctx, cancel = context.WithTimeout(t.Context(), time.Minute)
	res, err := p.cpClient(0).Execute(ctx, connect.NewRequest(&cpv1.ExecuteRequest{
		Execution: &executionv1.Execution{Language: "python", Code: p.witnessed("/redis-cut/stateless", 0)}, Tenant: "part",
		Egress: &executionv1.Egress{Allow: []*executionv1.EgressRule{{Host: "witness.test", Ports: []uint32{partWitnessPort}},
			{Host: p.witnessHost.IP.String(), Ports: []uint32{partWitnessPort}}}}}))
	cancel()
	if err != nil || res.Msg.GetResult().GetStdout() != "done\n" {
		t.Fatalf("a stateless run at the control plane cut from redis: %v", err)
	}
	p.sessionsCarryOnWithoutRedis(t, kept)
}

// sessionsCarryOnWithoutRedis checks, while the first control plane is
// cut from redis, that the session kept carries on through both edges,
// the first of which prefers the cut control plane, each cell run once,
// and that a new session opens through the first edge.
func (p *partitioned) sessionsCarryOnWithoutRedis(t *testing.T, kept string) {
	for i := range p.edges {
		path := fmt.Sprintf("/redis-cut/session/%d", i)
		out, err := p.runInVia(t.Context(), i, kept, "print(x)\n"+p.witnessed(path, 0))
		if err != nil || out != "41\ndone\n" {
			t.Fatalf("a session cell through edge %d while control plane 1 is cut from redis: %q, %v", i+1, out, err)
		}
		if _, err := p.ranOn(path); err != nil {
			t.Fatal(err)
		}
	}
	res2, err := p.edgeClient(0).CreateSession(t.Context(), connect.NewRequest(&edgev1.CreateSessionRequest{Language: "python"}))
	if err != nil {
		t.Fatalf("a new session through edge 1 while its control plane is cut from redis: %v", err)
	}
	if out, err := p.runIn(t.Context(), res2.Msg.GetSession().GetId(), "print(2*21)"); err != nil || out != "42\n" {
		t.Fatalf("the new session: %q, %v", out, err)
	}
}

// runIn runs code in session id through edge 1 and returns its output.
func (p *partitioned) runIn(ctx context.Context, id, code string) (string, error) {
	return p.runInVia(ctx, 0, id, code)
}

func (p *partitioned) runInVia(ctx context.Context, edge int, id, code string) (string, error) {
	res, err := p.edgeClient(edge).Execute(ctx, connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: code, SessionId: id}))
	if err != nil {
		return "", err
	}
	r := res.Msg.GetResult()
	if r.GetExitCode() != 0 {
		return r.GetStdout(), fmt.Errorf("exit %d: %s", r.GetExitCode(), r.GetStderr())
	}
	return r.GetStdout(), nil
}

// checkNotReborn fails t unless a session call's outcome is unavailable,
// not_found because the session was lost, or its old state: a NameError
// would be a new, empty kernel under the old id.
func checkNotReborn(t *testing.T, when, out string, err error) {
	t.Helper()
	switch {
	case err == nil && out == "41\n":
	case connect.CodeOf(err) == connect.CodeUnavailable:
	case connect.CodeOf(err) == connect.CodeNotFound && strings.Contains(err.Error(), "lost"):
	default:
		t.Errorf("the session on the cut agent, %s: %q, %v; want unavailable, not_found (lost) or x as it was", when, out, err)
	}
}

// strangerIsRefused shows that a host on the bridge without the CA or the
// secret gets nothing from any internal port: plain HTTP is refused, and
// over TLS (not checking whose certificate it is) a call without the
// secret, or with a wrong one, is unauthenticated; Redis wants its
// password.
func (p *partitioned) strangerIsRefused(t *testing.T, stranger *netns.Host) {
	t.Helper()
	plain := &http.Client{Transport: &http.Transport{DialContext: stranger.DialContext}, Timeout: 10 * time.Second}
	blind := func(bearer string) *http.Client {
		tr := &http.Transport{DialContext: stranger.DialContext, ForceAttemptHTTP2: true,
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}} //nolint:gosec // the stranger trusts anything
		return &http.Client{Transport: authTransport{base: tr, bearer: bearer}, Timeout: 10 * time.Second}
	}
	var internal []string
	for _, c := range p.cps {
		internal = append(internal, c.Addr)
	}
	for _, a := range p.agents {
		internal = append(internal, a.Addr)
	}
	for _, addr := range internal {
		if res, err := plain.Get("http://" + addr + "/status"); err == nil {
			res.Body.Close()
			if res.StatusCode < 400 {
				t.Errorf("plain HTTP to %s: HTTP %d, want refused", addr, res.StatusCode)
			}
		}
		for _, bearer := range []string{"", newSecret()} {
			c := controlplanev1connect.NewControlPlaneServiceClient(blind(bearer), "https://"+addr)
			_, err := c.ListAgents(t.Context(), connect.NewRequest(&cpv1.ListAgentsRequest{}))
			if connect.CodeOf(err) != connect.CodeUnauthenticated {
				t.Errorf("a stranger's call to %s with a credential %v: %v, want unauthenticated", addr, bearer != "", err)
			}
		}
	}
	// The edges are public doors: they too want a key.
	for i := range p.edges {
		c := edgev1connect.NewExecutionServiceClient(blind(""), "https://"+p.edges[i].Addr)
		_, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"}))
		if connect.CodeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("a stranger's run at edge %d: %v, want unauthenticated", i+1, err)
		}
	}
	// Redis: TLS only, and nothing without the password.
	conn, err := stranger.DialContext(t.Context(), "tcp", p.redis.Addr(partRedisPort))
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // the stranger trusts anything
	defer tc.Close()
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(tc, "GET anything\r\n"); err != nil {
		t.Fatal(err)
	}
	line := make([]byte, 64)
	k, _ := tc.Read(line)
	if !strings.HasPrefix(string(line[:k]), "-NOAUTH") {
		t.Errorf("a stranger's Redis command: %q, want -NOAUTH", line[:k])
	}
}
