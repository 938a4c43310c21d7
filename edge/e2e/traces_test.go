package e2e

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	collectorv1 "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonv1 "go.opentelemetry.io/proto/otlp/common/v1"
	tracev1 "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/server"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
	"github.com/codemode-go/codemode/internal/testkit/modeltest"
)

// receivedSpan is a span an OTLP receiver was sent, with the service.name
// of its resource and every attribute of its resource.
type receivedSpan struct {
	service  string
	resource []*commonv1.KeyValue
	*tracev1.Span
}

func (s receivedSpan) attr(key string) string {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return anyValueString(kv.GetValue())
		}
	}
	return ""
}

func anyValueString(v *commonv1.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonv1.AnyValue_StringValue:
		return x.StringValue
	case *commonv1.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonv1.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonv1.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	case *commonv1.AnyValue_BytesValue:
		return string(x.BytesValue)
	case *commonv1.AnyValue_ArrayValue:
		var parts []string
		for _, e := range x.ArrayValue.GetValues() {
			parts = append(parts, anyValueString(e))
		}
		return strings.Join(parts, ",")
	case *commonv1.AnyValue_KvlistValue:
		var parts []string
		for _, kv := range x.KvlistValue.GetValues() {
			parts = append(parts, kv.GetKey()+"="+anyValueString(kv.GetValue()))
		}
		return strings.Join(parts, ",")
	}
	return ""
}

// otlpReceiver is an OTLP/HTTP trace receiver on loopback: it decodes each
// ExportTraceServiceRequest and keeps its spans.
type otlpReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans []receivedSpan
}

func newOTLPReceiver(t testing.TB) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
			http.Error(w, "not an OTLP traces export", http.StatusNotFound)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		b, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var export collectorv1.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &export); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.add(&export)
		out, _ := proto.Marshal(&collectorv1.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *otlpReceiver) add(export *collectorv1.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range export.GetResourceSpans() {
		var service string
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				r.spans = append(r.spans, receivedSpan{service: service, resource: rs.GetResource().GetAttributes(), Span: sp})
			}
		}
	}
}

// all returns the spans received so far.
func (r *otlpReceiver) all() []receivedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]receivedSpan(nil), r.spans...)
}

// trace returns the spans of the trace that holds a span of service named
// name with request id id, once that trace also holds each span of want,
// "SERVICE NAME" (spans arrive in batches, each service's own).
func (r *otlpReceiver) trace(t *testing.T, service, name, id string, want ...string) []receivedSpan {
	t.Helper()
	var found []receivedSpan
	testkit.Eventually(t, 15*time.Second, func() error {
		all := r.all()
		for _, s := range all {
			if s.service != service || s.GetName() != name || s.attr("codemode.request_id") != id {
				continue
			}
			var tr []receivedSpan
			names := map[string]bool{}
			for _, o := range all {
				if string(o.GetTraceId()) == string(s.GetTraceId()) {
					tr = append(tr, o)
					names[o.service+" "+o.GetName()] = true
				}
			}
			done := true
			for _, w := range want {
				done = done && names[w]
			}
			if done {
				found = tr
				return nil
			}
		}
		return fmt.Errorf("no trace with a %s span %q of request %s and spans %q; received:\n%s", service, name, id, want, describe(all))
	})
	return found
}

func describe(spans []receivedSpan) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s %s trace=%s span=%s parent=%s kind=%s request_id=%s\n", s.service, s.GetName(),
			hex.EncodeToString(s.GetTraceId()), hex.EncodeToString(s.GetSpanId()), hex.EncodeToString(s.GetParentSpanId()),
			s.GetKind(), s.attr("codemode.request_id"))
	}
	return b.String()
}

// one returns the one span of tr from service with name and kind, failing
// the test when there is not exactly one.
func one(t *testing.T, tr []receivedSpan, service, name string, kind tracev1.Span_SpanKind) receivedSpan {
	t.Helper()
	var found []receivedSpan
	for _, s := range tr {
		if s.service == service && s.GetName() == name && s.GetKind() == kind {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d %s spans %q of kind %s in the trace, want 1:\n%s", len(found), service, name, kind, describe(tr))
	}
	return found[0]
}

// descends reports whether span is ancestor or below it in tr.
func descends(tr []receivedSpan, span, ancestor receivedSpan) bool {
	byID := make(map[string]receivedSpan, len(tr))
	for _, s := range tr {
		byID[string(s.GetSpanId())] = s
	}
	for s, ok := span, true; ok; s, ok = byID[string(s.GetParentSpanId())] {
		if string(s.GetSpanId()) == string(ancestor.GetSpanId()) {
			return true
		}
	}
	return false
}

// parentIs fails the test unless child's parent is parent.
func parentIs(t *testing.T, tr []receivedSpan, child, parent receivedSpan) {
	t.Helper()
	if string(child.GetParentSpanId()) != string(parent.GetSpanId()) {
		t.Errorf("the parent of %s %q is not %s %q:\n%s", child.service, child.GetName(), parent.service, parent.GetName(), describe(tr))
	}
}

// TestTraces starts a stack exporting spans to an in-test OTLP receiver,
// runs code through the edge's Connect API (unary, and a gRPC stream),
// POST /run and MCP, and checks
// that each run is one trace across the edge, the control plane and the
// agent, linked parent to child over the wire, down to the runner; that
// the request id is on each service's span; and that no span carries the
// program's source or the cluster secret. An edge started without the
// variables exports nothing: the control plane's span of its run is then
// the root of its trace.
func TestTraces(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	rec := newOTLPReceiver(t)
	env := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rec.URL, "OTEL_BSP_SCHEDULE_DELAY=100", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf"}
	s, err := startStackEnv("", env, "e2e-traces", "--min-active", "1")
	if err != nil {
		t.Fatalf("start stack: %v", err)
	}
	t.Cleanup(s.Stop)
	stamp := time.Now().UnixNano()
	// The source's marker must appear in no span; the program prints
	// something else.
	marker := fmt.Sprintf("source-marker-%d", stamp)
	tc := &tracesCase{s: s, rec: rec, env: env, stamp: stamp, marker: marker, code: fmt.Sprintf("marker = %q\nprint(len(marker))", marker)}
	t.Run("connect", tc.connect)
	t.Run("stream", tc.stream)
	t.Run("run", tc.run)
	t.Run("mcp", tc.mcp)
	t.Run("chat", tc.chat)
	t.Run("edge without the variables", tc.edgeWithoutTheVariables)
	t.Run("no code or secrets", tc.noCodeOrSecrets)
}

// tracesCase is TestTraces' stack, receiver and program.
type tracesCase struct {
	s      *Stack
	rec    *otlpReceiver
	env    []string // what makes a service export its spans to rec
	stamp  int64
	marker string // in the program's source, never printed
	code   string
}

// The services' names in the spans.
const (
	edgeService  = "codemode-edge"
	cpService    = "codemode-controlplane"
	agentService = "codemode-agent"
)

// traceHandlers are the handlers' spans of the control plane and the agent
// for method: they end after their children, and are exported with or
// after them.
func traceHandlers(method string) []string {
	return []string{"codemode-controlplane codemode.controlplane.v1.ControlPlaneService/" + method, "codemode-agent codemode.agent.v1.AgentService/" + method}
}

// checkChain checks that tr links the edge's client call (of method)
// to the control plane's handler, its client call to the agent's
// handler, and that handler to the runner, carrying the request id id.
func (tc *tracesCase) checkChain(t *testing.T, tr []receivedSpan, edgeSpan receivedSpan, id, method string) {
	t.Helper()
	services := map[string]bool{}
	for _, sp := range tr {
		services[sp.service] = true
	}
	for _, svc := range []string{edgeService, cpService, agentService} {
		if !services[svc] {
			t.Errorf("the trace has no span of %s:\n%s", svc, describe(tr))
		}
	}
	edgeClient := one(t, tr, edgeService, "codemode.controlplane.v1.ControlPlaneService/"+method, tracev1.Span_SPAN_KIND_CLIENT)
	cpServer := one(t, tr, cpService, "codemode.controlplane.v1.ControlPlaneService/"+method, tracev1.Span_SPAN_KIND_SERVER)
	cpClient := one(t, tr, cpService, "codemode.agent.v1.AgentService/"+method, tracev1.Span_SPAN_KIND_CLIENT)
	agentServer := one(t, tr, agentService, "codemode.agent.v1.AgentService/"+method, tracev1.Span_SPAN_KIND_SERVER)
	runner := one(t, tr, agentService, "runner", tracev1.Span_SPAN_KIND_INTERNAL)
	route := one(t, tr, cpService, "route", tracev1.Span_SPAN_KIND_INTERNAL)
	acquire := one(t, tr, agentService, "sandbox.acquire", tracev1.Span_SPAN_KIND_INTERNAL)
	if !descends(tr, edgeClient, edgeSpan) {
		t.Errorf("the edge's call to the control plane is not below its door's span:\n%s", describe(tr))
	}
	parentIs(t, tr, cpServer, edgeClient)
	if !descends(tr, cpClient, cpServer) || !descends(tr, route, cpServer) {
		t.Errorf("the control plane's route and call to the agent are not below its handler's span:\n%s", describe(tr))
	}
	parentIs(t, tr, agentServer, cpClient)
	parentIs(t, tr, runner, agentServer)
	parentIs(t, tr, acquire, agentServer)
	if got := route.attr("codemode.agent"); got != tc.s.Agent.Addr {
		t.Errorf("route span's codemode.agent = %q, want the agent's address %s", got, tc.s.Agent.Addr)
	}
	for _, sp := range []receivedSpan{edgeSpan, cpServer, agentServer} {
		if got := sp.attr("codemode.request_id"); got != id {
			t.Errorf("%s span %q has request id %q, want %q", sp.service, sp.GetName(), got, id)
		}
		if got := sp.attr("codemode.outcome"); got != "ok" {
			t.Errorf("%s span %q has outcome %q, want ok", sp.service, sp.GetName(), got)
		}
		if got := sp.attr("codemode.language"); got != "python" {
			t.Errorf("%s span %q has language %q, want python", sp.service, sp.GetName(), got)
		}
	}
	if got := runner.attr("codemode.exit_code"); got != "0" {
		t.Errorf("runner span's exit code = %q, want 0", got)
	}
}

// connect runs the program through the edge's Connect API.
func (tc *tracesCase) connect(t *testing.T) {
	id := fmt.Sprintf("trace-connect-%d", tc.stamp)
	hc := server.NewClient()
	hc.Transport = headerTransport{key: server.RequestIDHeader, value: id, base: hc.Transport}
	client := edgev1connect.NewExecutionServiceClient(hc, tc.s.Edge.URL())
	res, err := client.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: tc.code}))
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	if got, want := res.Msg.GetResult().GetStdout(), fmt.Sprintf("%d\n", len(tc.marker)); got != want {
		t.Fatalf("stdout %q, want %q", got, want)
	}
	tr := tc.rec.trace(t, edgeService, "codemode.edge.v1.ExecutionService/Execute", id, traceHandlers("Execute")...)
	door := one(t, tr, edgeService, "codemode.edge.v1.ExecutionService/Execute", tracev1.Span_SPAN_KIND_SERVER)
	if len(door.GetParentSpanId()) != 0 {
		t.Errorf("the edge's span has a parent: callers' trace context is only linked at the public door")
	}
	tc.checkChain(t, tr, door, id, "Execute")
	// Each service's execution line names the trace.
	traceID := hex.EncodeToString(door.GetTraceId())
	for name, p := range map[string]*Process{"edge": tc.s.Edge, "control plane": tc.s.ControlPlane, "agent": tc.s.Agent} {
		testkit.WaitFor(t, 10*time.Second, name+"'s execution line with the trace id", func() bool {
			for _, l := range strings.Split(p.Logs(), "\n") {
				if strings.Contains(l, `"msg":"execution"`) && strings.Contains(l, id) && strings.Contains(l, `"trace_id":"`+traceID+`"`) {
					return true
				}
			}
			return false
		})
	}
}

// stream runs the program as a gRPC stream.
func (tc *tracesCase) stream(t *testing.T) {
	id := fmt.Sprintf("trace-stream-%d", tc.stamp)
	hc := server.NewClient()
	hc.Transport = headerTransport{key: server.RequestIDHeader, value: id, base: hc.Transport}
	client := edgev1connect.NewExecutionServiceClient(hc, tc.s.Edge.URL(), connect.WithGRPC())
	st, err := client.ExecuteStream(t.Context(), connect.NewRequest(&edgev1.ExecuteStreamRequest{Language: "python", Code: tc.code}))
	if err != nil {
		t.Fatalf("ExecuteStream: %v", err)
	}
	for st.Receive() {
	}
	if err := st.Err(); err != nil {
		t.Fatalf("ExecuteStream: %v", err)
	}
	tr := tc.rec.trace(t, edgeService, "codemode.edge.v1.ExecutionService/ExecuteStream", id, traceHandlers("ExecuteStream")...)
	tc.checkChain(t, tr, one(t, tr, edgeService, "codemode.edge.v1.ExecutionService/ExecuteStream", tracev1.Span_SPAN_KIND_SERVER), id, "ExecuteStream")
}

// run runs the program through POST /run.
func (tc *tracesCase) run(t *testing.T) {
	id := fmt.Sprintf("trace-run-%d", tc.stamp)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, tc.s.Edge.URL()+"/run",
		strings.NewReader(fmt.Sprintf(`{"code": %q, "language": "python"}`, tc.code)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(server.RequestIDHeader, id)
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("POST /run: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("POST /run: %s", resp.Status)
	}
	tr := tc.rec.trace(t, edgeService, "POST /run", id, traceHandlers("Execute")...)
	tc.checkChain(t, tr, one(t, tr, edgeService, "POST /run", tracev1.Span_SPAN_KIND_SERVER), id, "Execute")
}

// mcp runs the program through MCP's execute_code.
func (tc *tracesCase) mcp(t *testing.T) {
	id := fmt.Sprintf("trace-mcp-%d", tc.stamp)
	hc := server.NewClient()
	hc.Transport = headerTransport{key: server.RequestIDHeader, value: id, base: hc.Transport}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "e2e-traces", Version: "1"}, nil).
		Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: tc.s.Edge.URL() + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("connect MCP: %v", err)
	}
	defer cs.Close()
	res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"code": tc.code}})
	if err != nil || res.IsError {
		t.Fatalf("execute_code: %v %+v", err, res)
	}
	// The POST's span ends last: the trace is complete with it.
	tr := tc.rec.trace(t, edgeService, "POST /mcp", id, append(traceHandlers("Execute"), edgeService+" tools/call execute_code")...)
	tool := one(t, tr, edgeService, "tools/call execute_code", tracev1.Span_SPAN_KIND_INTERNAL)
	post := one(t, tr, edgeService, "POST /mcp", tracev1.Span_SPAN_KIND_SERVER)
	parentIs(t, tr, tool, post)
	tc.checkChain(t, tr, tool, id, "Execute")
}

// chat asks a scripted model, through an edge of the stack with a chat
// provider, a question it answers with execute_code: the tool call is a
// span below the ChatService's, in one trace with the control plane's and
// the agent's spans of the run; the chat's span has the request id and
// the tokens.
func (tc *tracesCase) chat(t *testing.T) {
	model := modeltest.NewOpenAI(t, chatScript)
	keyFile := filepath.Join(t.TempDir(), "chat-key")
	if err := os.WriteFile(keyFile, []byte(chatKey), 0o600); err != nil {
		t.Fatal(err)
	}
	edge, err := tc.s.StartEdge(tc.env, "--chat-provider", "openai", "--chat-base-url", model.URL, "--chat-model", "scripted-traces", "--chat-key-file", keyFile)
	if err != nil {
		t.Fatalf("start edge: %v", err)
	}
	defer edge.Stop(30 * time.Second)
	id := fmt.Sprintf("trace-chat-%d", tc.stamp)
	hc := server.NewClient()
	hc.Transport = headerTransport{key: server.RequestIDHeader, value: id, base: hc.Transport}
	if r := chat(t, edgev1connect.NewChatServiceClient(hc, edge.URL()), edgev1.Door_DOOR_CODE, askSquares); !strings.Contains(r.done.GetAnswer(), "338350") {
		t.Fatalf("answer %q", r.done.GetAnswer())
	}
	const rpc = "codemode.edge.v1.ChatService/Chat"
	// The chat asks for the run's output as it comes: ExecuteStream.
	tr := tc.rec.trace(t, edgeService, rpc, id, append(traceHandlers("ExecuteStream"), edgeService+" tools/call execute_code")...)
	tool := one(t, tr, edgeService, "tools/call execute_code", tracev1.Span_SPAN_KIND_INTERNAL)
	if door := one(t, tr, edgeService, rpc, tracev1.Span_SPAN_KIND_SERVER); !descends(tr, tool, door) {
		t.Errorf("the tool call's span is not below the chat's:\n%s", describe(tr))
	} else if door.attr("gen_ai.usage.input_tokens") != "304" || door.attr("codemode.chat.turns") != "2" {
		t.Errorf("the chat's span has tokens %q, turns %q", door.attr("gen_ai.usage.input_tokens"), door.attr("codemode.chat.turns"))
	}
}

// edgeWithoutTheVariables runs the program through an edge that exports
// no spans.
func (tc *tracesCase) edgeWithoutTheVariables(t *testing.T) {
	quiet, err := tc.s.StartEdge(nil)
	if err != nil {
		t.Fatalf("start edge: %v", err)
	}
	defer quiet.Stop(30 * time.Second)
	id := fmt.Sprintf("trace-off-%d", tc.stamp)
	hc := server.NewClient()
	hc.Transport = headerTransport{key: server.RequestIDHeader, value: id, base: hc.Transport}
	client := edgev1connect.NewExecutionServiceClient(hc, quiet.URL())
	if _, err := client.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: tc.code})); err != nil {
		t.Fatalf("Execute: %v", err)
	}
	// The control plane and the agent still export; the edge sent
	// no trace context, so the control plane's span is a root.
	tr := tc.rec.trace(t, cpService, "codemode.controlplane.v1.ControlPlaneService/Execute", id, traceHandlers("Execute")...)
	for _, sp := range tr {
		if sp.service == edgeService {
			t.Errorf("an edge without OTEL_EXPORTER_OTLP_ENDPOINT exported a span: %s %q", sp.service, sp.GetName())
		}
	}
	root := one(t, tr, cpService, "codemode.controlplane.v1.ControlPlaneService/Execute", tracev1.Span_SPAN_KIND_SERVER)
	if len(root.GetParentSpanId()) != 0 {
		t.Errorf("the control plane's span has a parent although the edge traces nothing:\n%s", describe(tr))
	}
}

// noCodeOrSecrets checks every span received: none carries the program's
// source or the cluster secret.
func (tc *tracesCase) noCodeOrSecrets(t *testing.T) {
	all := tc.rec.all()
	if len(all) == 0 {
		t.Fatal("no spans received")
	}
	for _, sp := range all {
		texts := []string{sp.GetName()}
		for _, kv := range append(append([]*commonv1.KeyValue(nil), sp.GetAttributes()...), sp.resource...) {
			texts = append(texts, kv.GetKey()+"="+anyValueString(kv.GetValue()))
		}
		for _, ev := range sp.GetEvents() {
			texts = append(texts, ev.GetName())
			for _, kv := range ev.GetAttributes() {
				texts = append(texts, kv.GetKey()+"="+anyValueString(kv.GetValue()))
			}
		}
		for _, l := range sp.GetLinks() {
			for _, kv := range l.GetAttributes() {
				texts = append(texts, kv.GetKey()+"="+anyValueString(kv.GetValue()))
			}
		}
		texts = append(texts, sp.GetStatus().GetMessage())
		for _, text := range texts {
			if strings.Contains(text, tc.marker) || strings.Contains(text, "marker = ") {
				t.Errorf("%s span %q carries the program's source: %q", sp.service, sp.GetName(), text)
			}
			if strings.Contains(text, chatKey) {
				t.Errorf("%s span %q carries the chat provider's key: %q", sp.service, sp.GetName(), text)
			}
			if strings.Contains(text, tc.s.Secret) || strings.Contains(strings.ToLower(text), "bearer") {
				t.Errorf("%s span %q carries the cluster secret or a bearer header: %q", sp.service, sp.GetName(), text)
			}
		}
	}
}

// BenchmarkTracing measures what tracing adds to a run: print(1) through a
// stack whose three services export every span to an in-test OTLP receiver
// and through a stack with tracing off, interleaved in the same run.
//
//	go test -run '^$' -bench Tracing -benchtime 200x ./edge/e2e/
func BenchmarkTracing(b *testing.B) {
	dockertest.Need(b)
	rec := newOTLPReceiver(b)
	on, err := startStackEnv("", []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rec.URL}, "e2e-bench-traced", "--min-active", "2")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(on.Stop)
	off, err := StartStack("e2e-bench-untraced", "--min-active", "2")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(off.Stop)
	runOnce := func(s *Stack) func() {
		c := edgev1connect.NewExecutionServiceClient(server.NewClient(), s.Edge.URL())
		return func() {
			res, err := c.Execute(b.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: "print(1)"}))
			if err != nil || res.Msg.GetResult().GetStdout() != "1\n" {
				b.Fatalf("run: %v %v", res, err)
			}
		}
	}
	pairedLatency(b, pair{"traced", runOnce(on)}, pair{"untraced", runOnce(off)})
	b.ReportMetric(float64(len(rec.all()))/float64(b.N), "spans/op")
}
