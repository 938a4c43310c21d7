package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/codemode-go/codemode/edge/internal/chatcompare"
	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/apistest"
	"github.com/codemode-go/codemode/internal/testkit/modeltest"
)

// chatKey is the provider's API key of the chat edges, in a file.
const chatKey = "sk-chat-e2e-0123456789abcdefghijklmnop"

// The questions the scripted model knows, and what it does for each.
const (
	// askSquares: execute_code, or on the direct door the repositories
	// tool; then an answer quoting the result.
	askSquares = "What is the sum of the squares of the integers from 1 to 100?"
	// askRepos: the repositories tool, or code fetching them from the
	// declared API; then an answer quoting the result.
	askRepos = "Which public repositories does octocat have?"
	// askLoop: list_languages, forever.
	askLoop = "Keep checking the languages."
	// askSearch: execute_code searching the sandbox for the key.
	askSearch = "Look around the sandbox."
	// askPlot: execute_code drawing a plot.
	askPlot = "Plot the squares of 0 to 9."
	// askSlow: execute_code printing for a minute.
	askSlow = "Count slowly."
	// askBig: list_languages, forever, each turn reporting 600 tokens in.
	askBig = "Read everything, again and again."
)

// squaresCode computes askSquares' answer, 338350.
const squaresCode = "print(sum(i * i for i in range(1, 101)))"

// chatScript is the scripted model of the chat tests: each question gets a
// tool call, then an answer quoting the tool's result. Tokens: a tool
// call turn reports 100+len(messages) in and 20 out, an answer 200+len in
// and 10 out.
func chatScript(r modeltest.Request) modeltest.Reply {
	q := r.Question()
	last := r.Last()
	if last.Role == "tool" && q != askLoop && q != askBig {
		res := last.Results[0]
		prefix := "The tool answered: "
		// Anthropic's results say is_error; the chat service starts
		// OpenAI's, which cannot, with "Error: ".
		if res.IsError || strings.HasPrefix(res.Text, "Error: ") {
			prefix = "The tool failed: "
		}
		return modeltest.Reply{Text: prefix + cut(strings.TrimPrefix(strings.TrimSpace(res.Text), "Error: "), 2000), InputTokens: 200 + int64(len(r.Messages)), OutputTokens: 10}
	}
	call := func(name string, args map[string]any) modeltest.Reply {
		b, _ := json.Marshal(args)
		return modeltest.Reply{Text: "Let me check.", Calls: []modeltest.Call{{Name: name, Arguments: string(b)}},
			InputTokens: 100 + int64(len(r.Messages)), OutputTokens: 20}
	}
	code := r.HasTool("execute_code")
	switch q {
	case askSquares:
		if !code {
			return modeltest.Reply{Text: "I cannot run code here; it is 338350 by the formula n(n+1)(2n+1)/6.", InputTokens: 90, OutputTokens: 30}
		}
		return call("execute_code", map[string]any{"language": "python", "code": squaresCode})
	case askRepos:
		if !code {
			return call("github_list_user_repos", map[string]any{"username": "octocat"})
		}
	case askLoop:
		return call("list_languages", map[string]any{})
	case askBig:
		rep := call("list_languages", map[string]any{})
		rep.InputTokens = 600
		return rep
	case askSearch:
		return call("execute_code", map[string]any{"language": "python", "code": sandboxSearch(reverse(chatKey))})
	case askPlot:
		// The first line comes a second before the plot: the page shows
		// it while the code still runs.
		return call("execute_code", map[string]any{"language": "python", "code": "import time\nprint('plotting', flush=True)\ntime.sleep(1)\n" +
			"import matplotlib.pyplot as plt\nplt.plot([i * i for i in range(10)])\nplt.title('squares')\nplt.show()"})
	case askSlow:
		// A session of each provider's edge: both edges serve alice.
		return call("execute_code", map[string]any{"language": "python", "session_id": slowSession(r.Model), "timeout_seconds": 90,
			"code": "import time\nfor i in range(600):\n    print(i, flush=True)\n    open('/workspace/ticks', 'a').write('.')\n    time.sleep(0.1)"})
	}
	// Any other question (compare's tasks): code computes something,
	// the direct door calls the API tool the question names.
	if code {
		return call("execute_code", map[string]any{"language": "python", "code": "print('checked', sum(range(10)))"})
	}
	switch ql := strings.ToLower(q); {
	case strings.Contains(ql, "closed"):
		return call("github_list_user_closed_pull_requests", map[string]any{"username": "octocat"})
	case strings.Contains(ql, "pull request"):
		return call("github_list_user_pull_requests", map[string]any{"username": "octocat"})
	case strings.Contains(ql, "issue"):
		return call("github_list_user_issues", map[string]any{"username": "octocat"})
	}
	return call("github_list_user_repos", map[string]any{"username": "octocat"})
}

// slowSession is the session askSlow's code runs in on the edge of model.
func slowSession(model string) string { return "chat-slow-" + strings.TrimPrefix(model, "scripted-") }

func cut(s string, n int) string { return s[:min(len(s), n)] }

// chatEdge is an edge with a chat provider, its scripted model, and the
// fake GitHub its declared API points at.
type chatEdge struct {
	edge  *Process
	model *modeltest.Server
	fake  *apistest.GitHub
}

// startChatEdge starts an edge of s as startAPIToolsEdge does (alice and
// mallory, mallory denied by policy), whose chat provider is a scripted
// model of the given format, with the key in a file and at most 3 turns;
// extra are more flags.
func startChatEdge(t *testing.T, s *Stack, provider string, extra ...string) *chatEdge {
	t.Helper()
	ce := &chatEdge{fake: apistest.NewGitHub(t)}
	if provider == "anthropic" {
		ce.model = modeltest.NewAnthropic(t, chatScript)
	} else {
		ce.model = modeltest.NewOpenAI(t, chatScript)
	}
	keyFile := filepath.Join(t.TempDir(), "chat-key")
	if err := os.WriteFile(keyFile, []byte(chatKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ce.edge = startAPIToolsEdge(t, s, ce.fake.URL, append([]string{"--chat-provider", provider, "--chat-base-url", ce.model.URL,
		"--chat-model", "scripted-" + provider, "--chat-key-file", keyFile, "--chat-max-turns", "3"}, extra...)...)
	return ce
}

// chatClient is a ChatService client of edge as the tenant of key.
func chatClient(edge *Process, key string) edgev1connect.ChatServiceClient {
	return edgev1connect.NewChatServiceClient(&http.Client{Transport: bearer{key: key, next: httpClient.Transport}}, edge.URL())
}

// chatRun is what one conversation streamed.
type chatRun struct {
	events  []*edgev1.ChatResponse
	text    string
	calls   []*edgev1.ToolCall
	results []*edgev1.ToolResult
	output  string
	usage   []*edgev1.Usage
	done    *edgev1.Done
}

// all is every event as JSON, to search.
func (r *chatRun) all() string {
	var b strings.Builder
	for _, ev := range r.events {
		j, _ := protojson.Marshal(ev)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// chat runs one conversation of question on door and collects its events.
func chat(t *testing.T, c edgev1connect.ChatServiceClient, door edgev1.Door, question string) *chatRun {
	t.Helper()
	st, err := c.Chat(t.Context(), connect.NewRequest(&edgev1.ChatRequest{Door: door,
		Messages: []*edgev1.ChatMessage{{Role: edgev1.ChatMessage_ROLE_USER, Text: question}}}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := &chatRun{}
	for st.Receive() {
		r.add(st.Msg())
	}
	if err := st.Err(); err != nil {
		t.Fatalf("chat %q: %v", question, err)
	}
	if r.done == nil {
		t.Fatalf("chat %q: no done event: %s", question, r.all())
	}
	return r
}

func (r *chatRun) add(ev *edgev1.ChatResponse) {
	r.events = append(r.events, ev)
	switch e := ev.GetEvent().(type) {
	case *edgev1.ChatResponse_Text:
		r.text += e.Text
	case *edgev1.ChatResponse_ToolCall:
		r.calls = append(r.calls, e.ToolCall)
	case *edgev1.ChatResponse_ToolOutput:
		r.output += e.ToolOutput.GetText()
	case *edgev1.ChatResponse_ToolResult:
		r.results = append(r.results, e.ToolResult)
	case *edgev1.ChatResponse_Usage:
		r.usage = append(r.usage, e.Usage)
	case *edgev1.ChatResponse_Done:
		r.done = e.Done
	}
}

// TestChat puts each provider's scripted model in front of an edge's own
// tools: code runs in a sandbox through /mcp's tools and the answer holds
// what it computed; the direct door calls a declared API tool; a model
// that loops is stopped at the turn bound; a policy's denial reaches the
// model as a tool error and the conversation goes on; the tokens are the
// sums of what the model reported; the key is in no event, result, log or
// sandbox; POST /chat streams the same; an edge with no provider says how
// to configure one.
func TestChat(t *testing.T) {
	t.Parallel()
	s := shared(t)
	t.Run("no provider", func(t *testing.T) {
		st, err := chatClient(s.Edge, "").Chat(t.Context(), connect.NewRequest(&edgev1.ChatRequest{
			Messages: []*edgev1.ChatMessage{{Role: edgev1.ChatMessage_ROLE_USER, Text: "hi"}}}))
		if err == nil {
			for st.Receive() {
			}
			err = st.Err()
		}
		if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "--chat-provider") {
			t.Fatalf("chat on an edge with no provider: %v", err)
		}
	})
	t.Run("bounds", func(t *testing.T) {
		t.Parallel()
		chatBounds(t, s)
	})
	for _, provider := range []string{"openai", "anthropic"} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			ce := startChatEdge(t, s, provider)
			alice := chatClient(ce.edge, apisKeyAlice)
			var streams strings.Builder
			keep := func(r *chatRun) *chatRun { streams.WriteString(r.all()); return r }
			t.Run("code", func(t *testing.T) { ce.code(t, keep(chatTokens(t, ce, alice, edgev1.Door_DOOR_CODE, askSquares))) })
			t.Run("direct", func(t *testing.T) { ce.direct(t, keep(chatTokens(t, ce, alice, edgev1.Door_DOOR_DIRECT, askRepos))) })
			t.Run("turn bound", func(t *testing.T) { chatTurnBound(t, keep(chatTokens(t, ce, alice, edgev1.Door_DOOR_CODE, askLoop))) })
			t.Run("policy denial", func(t *testing.T) {
				chatDenied(t, keep(chatTokens(t, ce, chatClient(ce.edge, apisKeyMallory), edgev1.Door_DOOR_CODE, askSquares)))
			})
			t.Run("key in no sandbox", func(t *testing.T) {
				r := keep(chat(t, alice, edgev1.Door_DOOR_CODE, askSearch))
				if len(r.results) != 1 || !strings.Contains(r.results[0].GetText(), "found: [] environ: False control: ['/tmp/control']") {
					t.Fatalf("search in the sandbox: %s", r.all())
				}
			})
			t.Run("POST /chat", func(t *testing.T) { keep(ce.plainHTTP(t)) })
			t.Run("cancel stops the code", func(t *testing.T) { ce.cancel(t, alice) })
			if provider == "openai" {
				t.Run("compare", ce.compare)
				t.Run("playground", ce.playground)
			}
			if strings.Contains(streams.String(), chatKey) {
				t.Error("the key is in a stream")
			}
			// The edge's logs are read as they come: the last line may lag.
			if err := testkit.Poll(5*time.Second, func() error {
				if !strings.Contains(ce.edge.Logs(), `"msg":"chat"`) {
					return errors.New("the edge logged no conversation")
				}
				return nil
			}); err != nil {
				t.Error(err)
			}
			if logs := ce.edge.Logs() + s.Logs(); strings.Contains(logs, chatKey) {
				t.Error("the key is in a log")
			}
			for _, r := range ce.model.Requests() {
				if !strings.Contains(r.Header.Get("Authorization")+r.Header.Get("X-Api-Key"), chatKey) {
					t.Fatalf("a request reached the model without the key: %v", r.Header)
				}
			}
		})
	}
}

// chatTokens runs chat and checks the tokens: each usage event is what the
// model reported for its turn, and the done event has their sums.
func chatTokens(t *testing.T, ce *chatEdge, c edgev1connect.ChatServiceClient, door edgev1.Door, question string) *chatRun {
	t.Helper()
	in0, out0 := ce.model.Tokens()
	r := chat(t, c, door, question)
	in1, out1 := ce.model.Tokens()
	var in, out uint64
	for _, u := range r.usage {
		in += u.GetInputTokens()
		out += u.GetOutputTokens()
	}
	d := r.done
	if d.GetInputTokens() != uint64(in1-in0) || d.GetOutputTokens() != uint64(out1-out0) || in != d.GetInputTokens() || out != d.GetOutputTokens() ||
		int(d.GetTurns()) != len(r.usage) {
		t.Errorf("tokens: done %d in %d out in %d turns, usage events %d in %d out in %d, the model reported %d in %d out",
			d.GetInputTokens(), d.GetOutputTokens(), d.GetTurns(), in, out, len(r.usage), in1-in0, out1-out0)
	}
	return r
}

func (ce *chatEdge) code(t *testing.T, r *chatRun) {
	d := r.done
	if d.GetReason() != edgev1.Done_REASON_ANSWERED || !strings.Contains(d.GetAnswer(), "338350") || !strings.Contains(r.text, "338350") {
		t.Fatalf("answer %v %q, streamed %q", d.GetReason(), d.GetAnswer(), r.text)
	}
	if len(r.calls) != 1 || r.calls[0].GetName() != "execute_code" || !strings.Contains(r.calls[0].GetArguments(), "range(1, 101)") ||
		len(r.results) != 1 || r.results[0].GetIsError() || strings.TrimSpace(r.results[0].GetText()) != "338350" ||
		!strings.Contains(r.results[0].GetStructured(), `"exit_code":0`) {
		t.Fatalf("tool calls %v, results %v", r.calls, r.results)
	}
	// Two turns: 101+20 and 203+10 tokens by the script.
	if d.GetTurns() != 2 || d.GetToolCalls() != 1 || d.GetInputTokens() != 101+203 || d.GetOutputTokens() != 30 {
		t.Errorf("done %v", d)
	}
}

func (ce *chatEdge) direct(t *testing.T, r *chatRun) {
	if r.done.GetReason() != edgev1.Done_REASON_ANSWERED || !strings.Contains(r.done.GetAnswer(), "octocat/Hello-World") {
		t.Fatalf("answer %v %.300q", r.done.GetReason(), r.done.GetAnswer())
	}
	if len(r.calls) != 1 || r.calls[0].GetName() != "github_list_user_repos" || len(r.results) != 1 || r.results[0].GetIsError() ||
		!strings.Contains(r.results[0].GetStructured(), `"status":200`) {
		t.Fatalf("tool calls %v, results %.300v", r.calls, r.results)
	}
	reqs := ce.fake.Requests()
	if len(reqs) == 0 || reqs[len(reqs)-1].Path != "/users/octocat/repos" {
		t.Fatalf("the fake API got %v", reqs)
	}
	// The model was offered the direct door's tools only.
	last := ce.model.Requests()[len(ce.model.Requests())-1]
	if last.HasTool("execute_code") || !last.HasTool("github_list_user_repos") {
		t.Errorf("tools offered on the direct door: %v", last.Tools)
	}
}

func chatTurnBound(t *testing.T, r *chatRun) {
	d := r.done
	if d.GetReason() != edgev1.Done_REASON_MAX_TURNS || !strings.Contains(d.GetMessage(), "stopped after 3 turns") ||
		!strings.Contains(d.GetMessage(), "--chat-max-turns") || d.GetTurns() != 3 || d.GetToolCalls() != 3 || len(r.results) != 3 {
		t.Fatalf("done %v, %d results", d, len(r.results))
	}
}

func chatDenied(t *testing.T, r *chatRun) {
	if len(r.results) != 1 || !r.results[0].GetIsError() || !strings.Contains(r.results[0].GetText(), "denied by policy tenantblock") {
		t.Fatalf("results %v", r.results)
	}
	if d := r.done; d.GetReason() != edgev1.Done_REASON_ANSWERED || d.GetTurns() != 2 ||
		!strings.Contains(d.GetAnswer(), "The tool failed: ") || !strings.Contains(d.GetAnswer(), "denied by policy tenantblock") {
		t.Fatalf("done %v", d)
	}
}

// plainHTTP asks through POST /chat: JSON lines, the last the done event.
func (ce *chatEdge) plainHTTP(t *testing.T) *chatRun {
	body := strings.NewReader(fmt.Sprintf(`{"message": %q, "door": "code"}`, askSquares))
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, ce.edge.URL()+"/chat", body)
	req.Header.Set("Authorization", "Bearer "+apisKeyAlice)
	req.Header.Set("Content-Type", "application/json")
	// HTTP/1.1, as curl speaks it: each event is flushed as it comes.
	h1 := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	res, err := h1.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != "application/x-ndjson" || res.ProtoMajor != 1 {
		t.Fatalf("POST /chat: %s %s", res.Status, res.Header.Get("Content-Type"))
	}
	r := &chatRun{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(nil, 8<<20)
	for sc.Scan() {
		ev := &edgev1.ChatResponse{}
		if err := protojson.Unmarshal(sc.Bytes(), ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		r.add(ev)
	}
	if r.done == nil || r.done.GetReason() != edgev1.Done_REASON_ANSWERED || !strings.Contains(r.done.GetAnswer(), "338350") {
		t.Fatalf("POST /chat streamed %s", r.all())
	}
	// Without a key: refused before anything runs.
	req, _ = http.NewRequestWithContext(t.Context(), http.MethodPost, ce.edge.URL()+"/chat", strings.NewReader(`{"message": "hi"}`))
	if res, err := httpClient.Do(req); err != nil || res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("POST /chat without a key: %v %v", res.Status, err)
	}
	return r
}

// cancel cancels a conversation while its code runs in a session: the
// run stops (its file stops growing).
func (ce *chatEdge) cancel(t *testing.T, c edgev1connect.ChatServiceClient) {
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	st, err := c.Chat(ctx, connect.NewRequest(&edgev1.ChatRequest{
		Messages: []*edgev1.ChatMessage{{Role: edgev1.ChatMessage_ROLE_USER, Text: askSlow}}}))
	if err != nil {
		t.Fatal(err)
	}
	r := &chatRun{}
	for st.Receive() {
		r.add(st.Msg())
		if strings.Contains(r.output, "3\n") {
			break
		}
	}
	if !strings.Contains(r.output, "3\n") {
		t.Fatalf("no output before the stream ended: %v %s", st.Err(), r.all())
	}
	stop()
	st.Close()
	session := slowSession(ce.model.Requests()[0].Model)
	exec := edgev1connect.NewExecutionServiceClient(&http.Client{Transport: bearer{key: apisKeyAlice, next: httpClient.Transport}}, ce.edge.URL())
	// The cancellation reaches the agent within a moment: the run is
	// killed, with its sandbox (the session gets a fresh one, without the
	// file), or the file stops growing well before the minute the code
	// would print for (a read may wait for the session's run to end).
	size := func() (int, error) {
		res, err := exec.ReadFile(t.Context(), connect.NewRequest(&edgev1.ReadFileRequest{SessionId: session, Path: "ticks"}))
		return len(res.Msg.GetFile().GetContent()), err
	}
	err = testkit.Poll(15*time.Second, func() error {
		a, err := size()
		if connect.CodeOf(err) == connect.CodeNotFound {
			return nil
		} else if err != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond)
		if b, err := size(); err != nil || a != b {
			return fmt.Errorf("the run went on after the conversation was cancelled: %d then %d ticks (%v)", a, b, err)
		}
		if a > 100 {
			return fmt.Errorf("the run went on for %d ticks after the conversation was cancelled at 4", a)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := testkit.Poll(5*time.Second, func() error {
		if !strings.Contains(ce.edge.Logs(), `"reason":"canceled"`) {
			return errors.New("the edge logged no cancelled conversation")
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
	_, _ = exec.CloseSession(t.Context(), connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: session}))
}

// compare runs `edge chat compare` on the example task file: its table and
// reports hold, per door, the turns, tool calls and tokens the scripted
// model was asked for and reported.
func (ce *chatEdge) compare(t *testing.T) {
	dir := t.TempDir()
	md, js := filepath.Join(dir, "report.md"), filepath.Join(dir, "report.json")
	before := len(ce.model.Requests())
	cmd := exec.CommandContext(t.Context(), filepath.Join(binDir, "edge"), "chat", "compare", "--tasks", filepath.Join(moduleRoot(), "docs/chat/github-tasks.jsonl"),
		"--url", ce.edge.URL(), "--markdown", md, "--json", js)
	cmd.Env = append(os.Environ(), "CODEMODE_API_KEY="+apisKeyAlice)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("edge chat compare: %v\n%s", err, out)
	}
	var rep chatcompare.Report
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	// What the model was asked on each door: a request offering
	// execute_code is the code door's.
	var want [2]chatcompare.Totals
	for _, r := range ce.model.Requests()[before:] {
		d := 1
		if r.HasTool("execute_code") {
			d = 0
		}
		want[d].Turns++
		want[d].ToolCalls += uint64(len(r.Reply.Calls))
		want[d].InputTokens += uint64(r.Reply.InputTokens)
		want[d].OutputTokens += uint64(r.Reply.OutputTokens)
	}
	for i, got := range []chatcompare.Totals{rep.Code, rep.Direct} {
		if got.Turns != want[i].Turns || got.ToolCalls != want[i].ToolCalls || got.InputTokens != want[i].InputTokens || got.OutputTokens != want[i].OutputTokens {
			t.Errorf("door %d: report %+v, the model was asked %+v", i, got, want[i])
		}
	}
	if len(rep.Results) != 5 || rep.Direct.Turns != 10 || rep.Direct.Matched != 2 || rep.Direct.Checked != 2 || rep.Code.Checked != 2 || rep.Code.Matched != 0 ||
		rep.Provider != "openai" || rep.Model != "scripted-openai" {
		t.Errorf("report %+v", rep)
	}
	if r := rep.Results[0]; !strings.Contains(r.Direct.Answer, "octocat/Hello-World") || !strings.Contains(r.Code.Answer, "checked 45") || *r.Direct.Matched != true || *r.Code.Matched {
		t.Errorf("first task %+v", r)
	}
	total := fmt.Sprintf("total code %d %d %d %d", rep.Code.Turns, rep.Code.ToolCalls, rep.Code.InputTokens, rep.Code.OutputTokens)
	if !strings.Contains(string(out), "input tokens") || !strings.Contains(strings.Join(strings.Fields(string(out)), " "), total) {
		t.Errorf("table:\n%s (want a line %q)", out, total)
	}
	m, err := os.ReadFile(md)
	if err != nil || !strings.Contains(string(m), fmt.Sprintf("| **total** | direct | %d | %d | %d | %d |", rep.Direct.Turns, rep.Direct.ToolCalls, rep.Direct.InputTokens, rep.Direct.OutputTokens)) {
		t.Errorf("markdown report (%v):\n%s", err, m)
	}
	t.Logf("edge chat compare:\n%s", out)
}

// playground drives the chat tab in Chromium (edge/web/test/chat.test.mjs)
// with the plot question. It leaves a screenshot at $CODEMODE_CHAT_SCREENSHOT
// when that is set, else in the test's temp dir.
func (ce *chatEdge) playground(t *testing.T) {
	dir := webDir(t, "playwright-core")
	shot := os.Getenv("CODEMODE_CHAT_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "chat.png")
	}
	nodeTest(t, dir, "chat.test.mjs", ce.edge.URL(), ce.edge.Logs, "CHROMIUM="+chromiumPath, "CODEMODE_API_KEY="+apisKeyAlice,
		"CODEMODE_CHAT_QUESTION="+askPlot, "CODEMODE_SCREENSHOT="+shot)
}

// chatBounds stops conversations at each bound of an edge whose chats may
// take 10 turns, 2 tool calls, 1000 tokens and 4 seconds, each with a
// Done saying which bound and the flag that sets it; and a tenant may
// have one conversation under way at once: a second is refused.
func chatBounds(t *testing.T, s *Stack) {
	ce := startChatEdge(t, s, "openai", "--chat-model", "scripted-bounds", // its own session for askSlow
		"--chat-max-turns", "10", "--chat-max-tool-calls", "2", "--chat-max-tokens", "1000", "--chat-max-duration", "4s", "--chat-tenant-conversations", "1")
	t.Cleanup(func() {
		exec := edgev1connect.NewExecutionServiceClient(&http.Client{Transport: bearer{key: apisKeyAlice, next: httpClient.Transport}}, ce.edge.URL())
		_, _ = exec.CloseSession(context.Background(), connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: slowSession("scripted-bounds")}))
	})
	alice := chatClient(ce.edge, apisKeyAlice)
	for _, tc := range []struct {
		question string
		reason   edgev1.Done_Reason
		message  string
		turns    uint32
		calls    uint32
	}{
		// A third call would be one too many.
		{askLoop, edgev1.Done_REASON_MAX_TOOL_CALLS, "stopped at 2 tool calls, the most a conversation may make (--chat-max-tool-calls)", 3, 2},
		// 1240 tokens after two turns: no third.
		{askBig, edgev1.Done_REASON_MAX_TOKENS, "stopped after 1240 tokens, over the 1000 a conversation may use (--chat-max-tokens)", 2, 2},
		// The code would print for a minute.
		{askSlow, edgev1.Done_REASON_MAX_DURATION, "stopped after 4s, the longest a conversation may take (--chat-max-duration)", 1, 1},
	} {
		t.Run(tc.reason.String(), func(t *testing.T) {
			r := chatTokens(t, ce, alice, edgev1.Door_DOOR_CODE, tc.question)
			if d := r.done; d.GetReason() != tc.reason || d.GetMessage() != tc.message || d.GetTurns() != tc.turns || d.GetToolCalls() != tc.calls {
				t.Fatalf("done %v", d)
			}
		})
	}
	// Last: the cancelled conversation may hold its place a moment.
	t.Run("one conversation at once", func(t *testing.T) {
		ctx, stop := context.WithCancel(t.Context())
		defer stop()
		st, err := alice.Chat(ctx, connect.NewRequest(&edgev1.ChatRequest{Messages: []*edgev1.ChatMessage{{Role: edgev1.ChatMessage_ROLE_USER, Text: askSlow}}}))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if !st.Receive() { // the first event: the conversation is under way
			t.Fatalf("the first conversation ended: %v", st.Err())
		}
		second, err := alice.Chat(t.Context(), connect.NewRequest(&edgev1.ChatRequest{Messages: []*edgev1.ChatMessage{{Role: edgev1.ChatMessage_ROLE_USER, Text: askLoop}}}))
		if err == nil {
			for second.Receive() {
			}
			err = second.Err()
		}
		if connect.CodeOf(err) != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "--chat-tenant-conversations") {
			t.Fatalf("a second conversation at once: %v", err)
		}
		stop()
	})
}
