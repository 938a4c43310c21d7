package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/codemode-go/codemode/docs"
	"github.com/codemode-go/codemode/internal/testkit"
)

// readmeEdge is the edge's address as the README and the docs write it.
const readmeEdge = "127.0.0.1:8000"

// bannerLines are the ready-to-paste lines `make up` prints for an edge at
// edge, from a checkout at root.
func bannerLines(root, edge string) []string {
	return []string{
		"claude mcp add --transport http codemode http://" + edge + "/mcp",
		"claude mcp add codemode-stdio -- " + filepath.Join(root, "bin", "edge") + " mcp-stdio --url http://" + edge,
		"npx @modelcontextprotocol/inspector@0.15.0 --cli http://" + edge + "/mcp --method tools/list",
		"npx @modelcontextprotocol/inspector@0.15.0 --cli http://" + edge + "/no-code/mcp --method tools/list",
	}
}

// checkBanner checks that `make up`'s output (read by log) holds the lines a
// user pastes into Claude Code and the MCP Inspector, with the real address,
// and that they are the README's quick start's lines.
func checkBanner(t *testing.T, root, edge string, log func() string) {
	t.Helper()
	testkit.Eventually(t, 2*time.Minute, func() error {
		if !strings.Contains(log(), "Ctrl-C stops all three.") {
			return fmt.Errorf("make up printed no banner\n%s", log())
		}
		return nil
	})
	out := log()
	quick := quickStartSteps(t, root)
	var all strings.Builder
	for _, b := range quick.Shell {
		all.WriteString(b.Text + "\n")
	}
	for _, line := range bannerLines(root, edge) {
		if !strings.Contains(out, "  "+line+"\n") {
			t.Errorf("make up's banner lacks the line %q\n%s", line, out)
		}
		asWritten := strings.ReplaceAll(line, edge, readmeEdge)
		asWritten = strings.ReplaceAll(asWritten, filepath.Join(root, "bin", "edge"), `"$PWD/bin/edge"`)
		if !strings.Contains(all.String(), asWritten+"\n") {
			t.Errorf("the README's quick start lacks the banner's line %q", asWritten)
		}
	}
}

// quickStartSteps reads the README's quick start.
func quickStartSteps(t *testing.T, root string) docs.Steps {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	sec, _, _, ok := docs.Parse(string(b)).Section(docs.QuickStartAnchor)
	if !ok {
		t.Fatalf("README.md has no #%s", docs.QuickStartAnchor)
	}
	steps := docs.QuickStart(sec)
	if len(steps.Shell) == 0 || steps.Playground == "" {
		t.Fatalf("the README's quick start has %d shell blocks and playground %q", len(steps.Shell), steps.Playground)
	}
	return steps
}

// runQuickStart runs, against the edge at edge, every shell block of the
// README's quick start as written (the address aside) and the docs' session
// and file examples, from the checkout at root, as a newcomer would paste
// them: each block must exit 0 and print no error, `claude mcp list` must
// find every server it added connected, and the playground must answer.
//
// Claude Code and the MCP Inspector are the versions edge/web pins (`make
// test` installs them): npx resolves the Inspector there, offline, and
// Claude Code keeps its configuration in a home of the test's own, with its
// network traffic other than to the edge turned off.
func runQuickStart(t *testing.T, root, edge string) {
	t.Helper()
	web := webDir(t, "@anthropic-ai/claude-code", "@modelcontextprotocol/inspector")
	npx, err := exec.LookPath("npx")
	if err != nil {
		t.Fatalf("npx is not installed (%v); install Node.js 20+ and run %s", err, webSetup)
	}
	shim := t.TempDir()
	// npx finds a pinned package in the project it runs in.
	script := "#!/bin/sh\ncd \"$CODEMODE_WEB\" && exec \"$CODEMODE_NPX\" \"$@\"\n"
	if err := os.WriteFile(filepath.Join(shim, "npx"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	env := []string{
		"HOME=" + t.TempDir(),
		"PATH=" + shim + ":" + filepath.Join(web, "node_modules", ".bin") + ":" + os.Getenv("PATH"),
		"CODEMODE_WEB=" + web, "CODEMODE_NPX=" + npx,
		"npm_config_offline=true", "npm_config_update_notifier=false", "npm_config_fund=false",
		"DISABLE_AUTOUPDATER=1", "DISABLE_TELEMETRY=1", "DISABLE_ERROR_REPORTING=1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
	}
	for _, kv := range makeFreeEnv() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "HOME", "PATH":
		default:
			env = append(env, kv)
		}
	}

	steps := quickStartSteps(t, root)
	blocks := steps.Shell
	doors, err := os.ReadFile(filepath.Join(root, "docs", "doors.md"))
	if err != nil {
		t.Fatal(err)
	}
	files, _, _, ok := docs.Parse(string(doors)).Section("sessions-and-files")
	if !ok || len(files.Shell()) == 0 {
		t.Fatal("docs/doors.md has no shell block under #sessions-and-files")
	}
	blocks = append(blocks, files.Shell()...)

	for _, b := range blocks {
		text := strings.ReplaceAll(b.Text, readmeEdge, edge)
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", text)
		cmd.Dir = root
		cmd.Env = env
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		cancel()
		t.Logf("block at line %d:\n%s\n--- output ---\n%s", b.N, text, out)
		if err != nil {
			t.Errorf("block at line %d failed: %v", b.N, err)
			continue
		}
		if msg := quickStartError(text, string(out)); msg != "" {
			t.Errorf("block at line %d: %s", b.N, msg)
		}
	}

	url := strings.ReplaceAll(steps.Playground, readmeEdge, edge)
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("playground %s: %v", url, err)
	}
	defer res.Body.Close()
	page, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if res.StatusCode != http.StatusOK || !strings.Contains(strings.ToLower(string(page)), "<html") {
		t.Errorf("playground %s: %s, %d bytes, want 200 and a page", url, res.Status, len(page))
	}
}

// quickStartError says what in a block's output shows that it went wrong,
// or returns "".
func quickStartError(script, out string) string {
	if strings.TrimSpace(out) == "" {
		return "printed nothing"
	}
	for _, bad := range []string{
		`"code":"`,        // a Connect error
		`"isError": true`, // an MCP tool's error, as the Inspector prints it
		`"isError":true`,
		"Failed", // Claude Code's and the Inspector's failures
		"Error:",
		"✗",
	} {
		if strings.Contains(out, bad) {
			return "its output has " + bad
		}
	}
	if strings.Contains(script, "claude mcp list") {
		added := strings.Count(script, "claude mcp add ")
		if got := strings.Count(out, "✓ Connected"); got < added {
			return fmt.Sprintf("claude mcp list shows %d servers connected, want %d", got, added)
		}
	}
	if strings.Contains(script, "--method tools/list") && !strings.Contains(out, `"execute_code"`) {
		return "tools/list does not list execute_code"
	}
	return ""
}
