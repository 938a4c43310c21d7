package chatcompare

import (
	"bytes"
	"strings"
	"testing"
)

// TestReadTasks reads JSON lines, skipping blank lines and comments,
// naming unnamed tasks by line, and refuses what it cannot run.
func TestReadTasks(t *testing.T) {
	t.Parallel()
	tasks, err := ReadTasks(strings.NewReader("# a comment\n\n{\"prompt\": \"a\", \"expect\": \"x+\"}\n{\"name\": \"b\", \"prompt\": \"b\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 2 || tasks[0].Name != "line 3" || tasks[0].Expect != "x+" || tasks[1].Name != "b" {
		t.Fatalf("tasks %+v", tasks)
	}
	for _, tc := range []struct{ in, want string }{
		{"", "no tasks"},
		{`{"prompt": ""}`, "line 1: no prompt"},
		{`{"prompt": "a", "expect": "("}`, "line 1: expect"},
		{`{"prompt": "a", "answer": "b"}`, "unknown field"},
		{`prompt: a`, "line 1"},
	} {
		if _, err := ReadTasks(strings.NewReader(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.in, err, tc.want)
		}
	}
}

// TestReports writes the table and the Markdown of a report: every figure,
// the totals, and the answers side by side, a | in an answer escaped.
func TestReports(t *testing.T) {
	t.Parallel()
	yes, no := true, false
	rep := &Report{Provider: "openai", Model: "m", Results: []Result{{
		Task:   Task{Name: "repos", Prompt: "p", Expect: "x"},
		Code:   Run{Door: "code", Reason: "answered", Answer: "a | b", Matched: &no, Turns: 2, ToolCalls: 1, InputTokens: 304, OutputTokens: 30, Seconds: 1.25},
		Direct: Run{Door: "direct", Reason: "max_turns", Message: "stopped after 3 turns", Answer: "c", Matched: &yes, Turns: 3, ToolCalls: 3, InputTokens: 500, OutputTokens: 60},
	}}}
	rep.Code.add(rep.Results[0].Code)
	rep.Direct.add(rep.Results[0].Direct)
	var table, md bytes.Buffer
	if err := WriteTable(&table, rep); err != nil {
		t.Fatal(err)
	}
	if err := WriteMarkdown(&md, rep); err != nil {
		t.Fatal(err)
	}
	fields := strings.Join(strings.Fields(table.String()), " ")
	for _, want := range []string{"repos code 2 1 304 30 1.2 no", "direct 3 3 500 60 0.0 yes", "total code 2 1 304 30 1.2 0/1", "direct 3 3 500 60 0.0 1/1",
		"code: a | b", "direct: c [max_turns: stopped after 3 turns]"} {
		if !strings.Contains(fields, want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	for _, want := range []string{"Model: m (openai).", "| repos | code | 2 | 1 | 304 | 30 | 1.2 | no |", "| **total** | direct | 3 | 3 | 500 | 60 | 0.0 | 1/1 |",
		`| repos | a \| b | c [max_turns: stopped after 3 turns] |`} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
}
