// Package chatcompare is `edge chat compare`: it runs every task of a file
// through an edge's ChatService on both doors, code (/mcp's tools) and
// direct (/mcp-no-code-execute's), with the edge's one model, and reports
// per task and in total the turns, tool calls, input and output tokens,
// wall time, whether the answer matched the task's pattern, and the two
// answers side by side: as a table, and as Markdown and JSON reports.
package chatcompare

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/cli"
	"github.com/codemode-go/codemode/internal/cluster"
	"github.com/codemode-go/codemode/internal/server"
)

// Command is the argument after `chat` that selects Run.
const Command = "compare"

// Task is one line of a task file.
type Task struct {
	// Name labels the task in the report; empty: its line number.
	Name string `json:"name,omitempty"`
	// Prompt is the question.
	Prompt string `json:"prompt"`
	// Expect is a regular expression the answer should match; empty: no
	// check.
	Expect string `json:"expect,omitempty"`
}

// Run is one conversation's figures.
type Run struct {
	Door         string  `json:"door"`
	Reason       string  `json:"reason"`
	Message      string  `json:"message,omitempty"`
	Answer       string  `json:"answer"`
	Matched      *bool   `json:"matched,omitempty"`
	Turns        uint32  `json:"turns"`
	ToolCalls    uint32  `json:"tool_calls"`
	InputTokens  uint64  `json:"input_tokens"`
	OutputTokens uint64  `json:"output_tokens"`
	Seconds      float64 `json:"seconds"`
	Error        string  `json:"error,omitempty"`
}

// Result is a task's two runs.
type Result struct {
	Task   Task `json:"task"`
	Code   Run  `json:"code"`
	Direct Run  `json:"direct"`
}

// Totals sums the runs of one door.
type Totals struct {
	Turns        uint64  `json:"turns"`
	ToolCalls    uint64  `json:"tool_calls"`
	InputTokens  uint64  `json:"input_tokens"`
	OutputTokens uint64  `json:"output_tokens"`
	Seconds      float64 `json:"seconds"`
	Matched      int     `json:"matched"`
	Checked      int     `json:"checked"`
	Failed       int     `json:"failed"`
}

func (t *Totals) add(r Run) {
	t.Turns += uint64(r.Turns)
	t.ToolCalls += uint64(r.ToolCalls)
	t.InputTokens += r.InputTokens
	t.OutputTokens += r.OutputTokens
	t.Seconds += r.Seconds
	if r.Matched != nil {
		t.Checked++
		if *r.Matched {
			t.Matched++
		}
	}
	if r.Error != "" {
		t.Failed++
	}
}

// Report is what compare found.
type Report struct {
	Provider string   `json:"provider,omitempty"`
	Model    string   `json:"model,omitempty"`
	Results  []Result `json:"results"`
	Code     Totals   `json:"code"`
	Direct   Totals   `json:"direct"`
}

// ReadTasks reads a task file: one JSON object a line; blank lines and
// lines starting with # are skipped.
func ReadTasks(r io.Reader) ([]Task, error) {
	var tasks []Task
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		var t Task
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&t); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if strings.TrimSpace(t.Prompt) == "" {
			return nil, fmt.Errorf("line %d: no prompt", n)
		}
		if t.Expect != "" {
			if _, err := regexp.Compile(t.Expect); err != nil {
				return nil, fmt.Errorf("line %d: expect: %w", n, err)
			}
		}
		if t.Name == "" {
			t.Name = fmt.Sprintf("line %d", n)
		}
		tasks = append(tasks, t)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(tasks) == 0 {
		return nil, errors.New("no tasks")
	}
	return tasks, nil
}

// Compare runs every task on both doors, one conversation at a time.
func Compare(ctx context.Context, c edgev1connect.ChatServiceClient, tasks []Task) (*Report, error) {
	rep := &Report{}
	for _, t := range tasks {
		res := Result{Task: t}
		for _, door := range []edgev1.Door{edgev1.Door_DOOR_CODE, edgev1.Door_DOOR_DIRECT} {
			run, done, err := converse(ctx, c, t, door)
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				if connect.CodeOf(err) == connect.CodeFailedPrecondition || connect.CodeOf(err) == connect.CodeUnauthenticated {
					return nil, err
				}
				run.Error = err.Error()
			}
			if done != nil && rep.Provider == "" {
				rep.Provider, rep.Model = done.GetProvider(), done.GetModel()
			}
			if door == edgev1.Door_DOOR_CODE {
				res.Code = run
				rep.Code.add(run)
			} else {
				res.Direct = run
				rep.Direct.add(run)
			}
		}
		rep.Results = append(rep.Results, res)
	}
	return rep, nil
}

// converse runs one conversation and returns its figures.
func converse(ctx context.Context, c edgev1connect.ChatServiceClient, t Task, door edgev1.Door) (Run, *edgev1.Done, error) {
	run := Run{Door: strings.ToLower(strings.TrimPrefix(door.String(), "DOOR_"))}
	start := time.Now()
	st, err := c.Chat(ctx, connect.NewRequest(&edgev1.ChatRequest{Door: door,
		Messages: []*edgev1.ChatMessage{{Role: edgev1.ChatMessage_ROLE_USER, Text: t.Prompt}}}))
	if err != nil {
		return run, nil, err
	}
	defer st.Close()
	var done *edgev1.Done
	for st.Receive() {
		if d := st.Msg().GetDone(); d != nil {
			done = d
		}
	}
	run.Seconds = time.Since(start).Seconds()
	if err := st.Err(); err != nil {
		return run, nil, err
	}
	if done == nil {
		return run, nil, errors.New("the stream ended with no done event")
	}
	run.Reason = strings.ToLower(strings.TrimPrefix(done.GetReason().String(), "REASON_"))
	if done.GetReason() != edgev1.Done_REASON_ANSWERED {
		run.Message = done.GetMessage()
	}
	run.Answer, run.Turns, run.ToolCalls = done.GetAnswer(), done.GetTurns(), done.GetToolCalls()
	run.InputTokens, run.OutputTokens = done.GetInputTokens(), done.GetOutputTokens()
	if t.Expect != "" {
		m := regexp.MustCompile(t.Expect).MatchString(run.Answer)
		run.Matched = &m
	}
	return run, done, nil
}

// RunCommand is `edge chat compare`.
func RunCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlags("edge chat "+Command, stderr)
	tasksFile := fs.String("tasks", "", "task file: JSON lines {\"name\", \"prompt\", \"expect\": a regular expression the answer should match}")
	edgeURL := fs.String("url", "http://127.0.0.1:8000", "the edge's base URL")
	fs.Env("url", "CODEMODE_URL")
	key := fs.String("api-key", "", "API key sent to the edge; prefer the environment variable, which other users cannot see in the process list")
	fs.Env("api-key", "CODEMODE_API_KEY")
	markdown := fs.String("markdown", "", "write a Markdown report to this file")
	jsonOut := fs.String("json", "", "write a JSON report to this file")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage:\n  edge chat %s --tasks FILE [flags]\n\nRuns every task through the edge's chat on both doors, code and direct, with the edge's model, and compares.\n\nFlags:\n", Command)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args, os.Getenv); err != nil {
		return err
	}
	if *tasksFile == "" {
		return errors.New("--tasks FILE is required")
	}
	f, err := os.Open(*tasksFile)
	if err != nil {
		return err
	}
	tasks, err := ReadTasks(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("read tasks %s: %w", *tasksFile, err)
	}
	hc, base, err := server.NewEdgeClient(*edgeURL)
	if err != nil {
		return err
	}
	if *key != "" {
		hc = cluster.WithBearer(hc, *key)
	}
	rep, err := Compare(ctx, edgev1connect.NewChatServiceClient(hc, base), tasks)
	if err != nil {
		return err
	}
	if err := WriteTable(stdout, rep); err != nil {
		return err
	}
	if *markdown != "" {
		if err := writeFile(*markdown, func(w io.Writer) error { return WriteMarkdown(w, rep) }); err != nil {
			return err
		}
	}
	if *jsonOut != "" {
		if err := writeFile(*jsonOut, func(w io.Writer) error {
			e := json.NewEncoder(w)
			e.SetIndent("", "  ")
			return e.Encode(rep)
		}); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

func matched(r Run) string {
	switch {
	case r.Error != "":
		return "error"
	case r.Matched == nil:
		return "-"
	case *r.Matched:
		return "yes"
	}
	return "no"
}

// oneLine shortens an answer for a table cell.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		s = string(r[:n-1]) + "…"
	}
	return s
}

func totalsRow(t Totals) []any {
	return []any{t.Turns, t.ToolCalls, t.InputTokens, t.OutputTokens, fmt.Sprintf("%.1f", t.Seconds), fmt.Sprintf("%d/%d", t.Matched, t.Checked)}
}

func runRow(r Run) []any {
	return []any{r.Turns, r.ToolCalls, r.InputTokens, r.OutputTokens, fmt.Sprintf("%.1f", r.Seconds), matched(r)}
}

// WriteTable writes the report as a table for a terminal, then the answers.
func WriteTable(w io.Writer, rep *Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "task\tdoor\tturns\ttool calls\tinput tokens\toutput tokens\tseconds\tmatched\t")
	row := func(cells ...any) {
		for _, c := range cells {
			fmt.Fprintf(tw, "%v\t", c)
		}
		fmt.Fprintln(tw)
	}
	for _, r := range rep.Results {
		row(append([]any{r.Task.Name, "code"}, runRow(r.Code)...)...)
		row(append([]any{"", "direct"}, runRow(r.Direct)...)...)
	}
	row(append([]any{"total", "code"}, totalsRow(rep.Code)...)...)
	row(append([]any{"", "direct"}, totalsRow(rep.Direct)...)...)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, r := range rep.Results {
		fmt.Fprintf(w, "%s\n  code:   %s\n  direct: %s\n", r.Task.Name, answerText(r.Code, 200), answerText(r.Direct, 200))
	}
	return nil
}

func answerText(r Run, n int) string {
	switch {
	case r.Error != "":
		return "error: " + oneLine(r.Error, n)
	case r.Message != "":
		return oneLine(r.Answer, n) + " [" + r.Reason + ": " + r.Message + "]"
	}
	return oneLine(r.Answer, n)
}

// WriteMarkdown writes the report in Markdown.
func WriteMarkdown(w io.Writer, rep *Report) error {
	cell := func(s string) string { return strings.ReplaceAll(oneLine(s, 400), "|", "\\|") }
	fmt.Fprintf(w, "# Code mode against direct tools\n\n")
	if rep.Provider != "" {
		fmt.Fprintf(w, "Model: %s (%s).\n\n", rep.Model, rep.Provider)
	}
	fmt.Fprintf(w, "| task | door | turns | tool calls | input tokens | output tokens | seconds | matched |\n|---|---|--:|--:|--:|--:|--:|---|\n")
	for _, r := range rep.Results {
		for _, d := range []Run{r.Code, r.Direct} {
			fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %.1f | %s |\n", cell(r.Task.Name), d.Door, d.Turns, d.ToolCalls, d.InputTokens, d.OutputTokens, d.Seconds, matched(d))
		}
	}
	for _, t := range []struct {
		door string
		t    Totals
	}{{"code", rep.Code}, {"direct", rep.Direct}} {
		fmt.Fprintf(w, "| **total** | %s | %d | %d | %d | %d | %.1f | %d/%d |\n", t.door, t.t.Turns, t.t.ToolCalls, t.t.InputTokens, t.t.OutputTokens, t.t.Seconds, t.t.Matched, t.t.Checked)
	}
	fmt.Fprintf(w, "\n## Answers\n\n| task | code | direct |\n|---|---|---|\n")
	for _, r := range rep.Results {
		fmt.Fprintf(w, "| %s | %s | %s |\n", cell(r.Task.Name), cell(answerText(r.Code, 400)), cell(answerText(r.Direct, 400)))
	}
	return nil
}

// RunChat is `edge chat COMMAND`.
func RunChat(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == Command {
		return RunCommand(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "Usage:\n  edge chat %s --tasks FILE [flags]   compare code mode with direct tools (see edge chat %s --help)\n", Command, Command)
	return errors.New("edge chat: want the command " + Command)
}
