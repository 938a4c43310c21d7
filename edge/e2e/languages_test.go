package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/types/known/durationpb"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// languagePrograms are, for every language of the agents' table, a hello
// world and a program that writes its standard input upper-cased. A
// language the agents list without an entry here fails the test.
var languagePrograms = map[string]struct{ hello, stdin string }{
	"python":     {`print("hello")`, `import sys; print(sys.stdin.read().upper(), end="")`},
	"javascript": {`console.log("hello")`, `process.stdout.write(require("fs").readFileSync(0, "utf8").toUpperCase())`},
	"bash":       {`echo hello`, `tr a-z A-Z`},
	"sh":         {`echo hello`, `tr a-z A-Z`},
	"c": {"#include <stdio.h>\nint main(void) { puts(\"hello\"); return 0; }\n",
		"#include <ctype.h>\n#include <stdio.h>\nint main(void) { int c; while ((c = getchar()) != EOF) putchar(toupper(c)); return 0; }\n"},
	"cpp": {"#include <iostream>\nint main() { std::cout << \"hello\" << std::endl; }\n",
		"#include <cctype>\n#include <cstdio>\nint main() { for (int c; (c = std::getchar()) != EOF;) std::putchar(std::toupper(c)); }\n"},
	"ruby": {`puts "hello"`, `print STDIN.read.upcase`},
	"perl": {`print "hello\n";`, `print uc while <STDIN>;`},
	"php":  {"<?php\necho \"hello\\n\";\n", "<?php\necho strtoupper(stream_get_contents(STDIN));\n"},
	"lua":  {`print("hello")`, `io.write(string.upper(io.read("a")))`},
}

const languageStdin = "abc\nxyz\n"

// TestEveryLanguageThroughEveryDoor runs a hello world and a program that
// reads standard input in every language the agents list, through Connect,
// gRPC, gRPC-Web, MCP and the original's POST /run.
func TestEveryLanguageThroughEveryDoor(t *testing.T) {
	t.Parallel()
	s := shared(t)
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	langs := listLanguages(t, c)
	listed := map[string]*executionv1.Language{}
	for _, l := range langs {
		listed[l.GetName()] = l
		if l.GetVersion() == "" || l.GetFileName() == "" || l.GetSessionState() == "" {
			t.Errorf("language %s is listed without version, file name or session state: %v", l.GetName(), l)
		}
		if _, ok := languagePrograms[l.GetName()]; !ok {
			t.Errorf("language %s is listed but has no test programs here", l.GetName())
		}
	}
	for name := range languagePrograms {
		if listed[name] == nil {
			t.Errorf("language %s is not listed: %v", name, langs)
		}
	}
	if !listed["c"].GetCompiled() || listed["python"].GetSessionState() != "interpreter" || !slices.Contains(listed["python"].GetAliases(), "python3") {
		t.Errorf("table facts missing: c %v, python %v", listed["c"], listed["python"])
	}
	for name, prog := range languagePrograms {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, p := range protocols {
				c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL(), p.opts...)
				for _, run := range []struct{ code, stdin, want string }{{prog.hello, "", "hello\n"}, {prog.stdin, languageStdin, strings.ToUpper(languageStdin)}} {
					res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: name, Code: run.code, Stdin: []byte(run.stdin)}))
					if err != nil {
						t.Errorf("%s: %v", p.name, err)
						continue
					}
					if r := res.Msg.GetResult(); r.GetStdout() != run.want || r.GetExitCode() != 0 {
						t.Errorf("%s: exit %d stdout %q stderr %q, want %q", p.name, r.GetExitCode(), r.GetStdout(), r.GetStderr(), run.want)
					}
				}
			}
			cs := mcpSession(t, s.Edge.URL()+"/mcp")
			for _, run := range []struct{ code, stdin, want string }{{prog.hello, "", "hello\n"}, {prog.stdin, languageStdin, strings.ToUpper(languageStdin)}} {
				res, err := cs.CallTool(t.Context(), &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"language": name, "code": run.code, "stdin": run.stdin}})
				if err != nil {
					t.Errorf("mcp: %v", err)
				} else if res.IsError || testkit.ToolText(res) != run.want {
					t.Errorf("mcp: isError=%v %q, want %q", res.IsError, testkit.ToolText(res), run.want)
				}
				status, out := seedRunStdin(t, s.Edge, name, run.code, run.stdin)
				if status != 200 || out.Output != run.want {
					t.Errorf("/run: HTTP %d %+v, want %q", status, out, run.want)
				}
			}
		})
	}
}

// TestUnknownLanguageListsTheTable checks that an unknown language is
// invalid_argument naming the valid ones on every door, and that aliases
// run as their language.
func TestUnknownLanguageListsTheTable(t *testing.T) {
	t.Parallel()
	s := shared(t)
	for _, p := range protocols {
		c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL(), p.opts...)
		_, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "cobol", Code: "DISPLAY 42"}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("%s: %v, want invalid_argument", p.name, err)
		}
		for name := range languagePrograms {
			if !strings.Contains(err.Error(), name) {
				t.Errorf("%s: error %q does not name %s", p.name, err, name)
			}
		}
		_, err = c.CreateSession(t.Context(), connect.NewRequest(&edgev1.CreateSessionRequest{Language: "cobol"}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "python") {
			t.Errorf("%s: CreateSession: %v, want invalid_argument naming the languages", p.name, err)
		}
	}
	if res := callTool(t, s.Edge.URL()+"/mcp", "execute_code", map[string]any{"language": "cobol", "code": "x"}); !res.IsError || !strings.Contains(testkit.ToolText(res), "lua") {
		t.Errorf("mcp: isError=%v %q", res.IsError, testkit.ToolText(res))
	}
	if status, out := seedRunStdin(t, s.Edge, "cobol", "x", ""); status != 400 || !strings.Contains(out.Error, "python") {
		t.Errorf("/run: HTTP %d %+v, want 400 naming the languages", status, out)
	}
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	for alias, code := range map[string]string{"python3": `print("hello")`, "js": `console.log("hello")`, "c++": languagePrograms["cpp"].hello} {
		res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: alias, Code: code}))
		if err != nil || res.Msg.GetResult().GetStdout() != "hello\n" {
			t.Errorf("alias %s: %v %v", alias, res, err)
		}
	}
}

// TestCompiledLanguageWithinLimits checks that a compile error is the run's
// result (gcc's message, exit 1), and that compiling counts against the
// run's timeout.
func TestCompiledLanguageWithinLimits(t *testing.T) {
	t.Parallel()
	s := shared(t)
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "c", Code: "int main(void) { return x; }\n"}))
	if err != nil {
		t.Fatal(err)
	}
	if r := res.Msg.GetResult(); r.GetExitCode() != 1 || !strings.Contains(r.GetStderr(), "main.c:1") || !strings.Contains(r.GetStderr(), "undeclared") {
		t.Errorf("compile error: exit %d stderr %q, want exit 1 and gcc's message naming main.c", r.GetExitCode(), r.GetStderr())
	}
	res, err = c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "c", Code: "#include <math.h>\n#include <stdio.h>\nint main(void) { printf(\"%.3f\\n\", sqrt(2.0)); return 3; }\n"}))
	if err != nil || res.Msg.GetResult().GetStdout() != "1.414\n" || res.Msg.GetResult().GetExitCode() != 3 {
		t.Errorf("libm and exit status: %v %v", res, err)
	}
}

// TestLanguageFromATestOnlyTableEntry builds the agent and runner with a
// table entry that exists only in test builds, and checks that the edge,
// built without it and unchanged, lists it and runs it.
func TestLanguageFromATestOnlyTableEntry(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	dir := filepath.Join(binDir, "testlanguage")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := build(dir, "-tags", "codemode_testlanguage"); err != nil {
		t.Fatal(err)
	}
	s, err := startStackOf("testlanguage", "e2e-testlanguage", "--min-active", "1", "--max-sandboxes", "2", "--max-sessions", "1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	langs := listLanguages(t, c)
	if i := slices.IndexFunc(langs, func(l *executionv1.Language) bool { return l.GetName() == "awk" }); i < 0 || langs[i].GetVersion() == "" {
		t.Fatalf("awk not listed with a version: %v\n%s", langs, s.Logs())
	}
	for _, lang := range []string{"awk", "mawk"} {
		r, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: lang, Code: `{ print toupper($0) }`, Stdin: []byte(languageStdin)}))
		if err != nil || r.Msg.GetResult().GetStdout() != strings.ToUpper(languageStdin) {
			t.Errorf("%s: %v %v\n%s", lang, r, err, s.Logs())
		}
	}
	if res := callTool(t, s.Edge.URL()+"/mcp", "execute_code", map[string]any{"language": "awk", "code": `BEGIN { print "hello" }`}); res.IsError || testkit.ToolText(res) != "hello\n" {
		t.Errorf("mcp: isError=%v %q", res.IsError, testkit.ToolText(res))
	}
}

// listLanguages returns the languages the edge lists once every one has a
// version: versions are known once the agent's first sandbox has started,
// which may be after the agent reports itself healthy.
func listLanguages(t *testing.T, c edgev1connect.ExecutionServiceClient) []*executionv1.Language {
	t.Helper()
	var langs []*executionv1.Language
	testkit.Until(time.Minute, func() bool {
		res, err := c.ListLanguages(t.Context(), connect.NewRequest(&edgev1.ListLanguagesRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		langs = res.Msg.GetLanguages()
		return !slices.ContainsFunc(langs, func(l *executionv1.Language) bool { return l.GetVersion() == "" })
	})
	return langs
}

// TestAgentsDefaults starts an agent with its own default and longest
// timeouts, and checks that the edge reports them, fills them in, refuses a
// longer timeout with invalid_argument, and that the MCP tools describe
// them: the defaults are defined once, in the agent.
func TestAgentsDefaults(t *testing.T) {
	t.Parallel()
	dockertest.Need(t)
	s, err := StartStack("e2e-defaults", "--min-active", "1", "--max-sandboxes", "2", "--max-sessions", "1",
		"--default-timeout", "3s", "--max-timeout", "20s", "--default-output", "64k")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	listLanguages(t, c)
	res, err := c.ListLanguages(t.Context(), connect.NewRequest(&edgev1.ListLanguagesRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	d := res.Msg.GetDefaults()
	if d.GetLanguage() != "python" || d.GetTimeout().AsDuration() != 3*time.Second || d.GetMaxTimeout().AsDuration() != 20*time.Second || d.GetOutputBytes() != 64<<10 {
		t.Fatalf("defaults %v, want python, 3s, 20s, 64 KiB", d)
	}
	// The default timeout applies to a run that sets none.
	r, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "bash", Code: "sleep 10"}))
	if err != nil || !r.Msg.GetResult().GetTimedOut() || r.Msg.GetResult().GetDuration().AsDuration() > 6*time.Second {
		t.Errorf("run with no timeout: %v %v, want timed out after about 3s", r, err)
	}
	// A longer timeout than the agents allow is refused, naming the limit.
	_, err = c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Code: "print(1)", Timeout: durationpb.New(25 * time.Second)}))
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "20s") {
		t.Errorf("timeout 25s: %v, want invalid_argument naming 20s", err)
	}
	cs := mcpSession(t, s.Edge.URL()+"/mcp")
	tools, err := cs.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(tools.Tools, func(tool *mcp.Tool) bool { return tool.Name == "execute_code" })
	if i < 0 || !strings.Contains(tools.Tools[i].Description, "by default 3s of wall-clock time (timeout_seconds, at most 20s)") || !strings.Contains(tools.Tools[i].Description, "64 KiB of output") {
		t.Errorf("execute_code does not describe the agent's defaults: %v", tools.Tools)
	}
}
