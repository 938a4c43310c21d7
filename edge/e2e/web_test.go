package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// webSetup is the command that installs what the Node tests need
// (npm ci in edge/web, and Debian's chromium); `make test` runs it.
const webSetup = "bash edge/web/setup.sh"

// chromiumPath is where Debian's chromium package puts the browser.
const chromiumPath = "/usr/bin/chromium"

// webDir returns edge/web, failing the test when its Node dependencies are
// not installed: CI installs them before it runs the tests, so their absence
// is a broken setup, not a reason to skip.
func webDir(t *testing.T, packages ...string) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is not installed (%v); install Node.js 20+ and run %s", err, webSetup)
	}
	dir := filepath.Join(moduleRoot(), "edge", "web")
	for _, p := range packages {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", p, "package.json")); err != nil {
			t.Fatalf("edge/web/node_modules/%s is missing: run %s", p, webSetup)
		}
	}
	return dir
}

// tapCounts reads the summary that node --test prints with the TAP reporter.
var tapCounts = regexp.MustCompile(`(?m)^# (pass|fail) (\d+)$`)

// nodeTest runs one Node test file from edge/web/test against the edge at
// edgeURL and fails t, with the Node output and logs(), unless every test in
// it passed.
func nodeTest(t *testing.T, dir, file, edgeURL string, logs func() string, env ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", "--test", "--test-reporter=tap", filepath.Join("test", file))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"CODEMODE_EDGE_URL=" + edgeURL}, env...)...)
	// The browser is a child of node: on timeout, kill the whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	counts := map[string]int{}
	for _, m := range tapCounts.FindAllStringSubmatch(out.String(), -1) {
		counts[m[1]], _ = strconv.Atoi(m[2])
	}
	if err != nil || counts["pass"] == 0 || counts["fail"] != 0 {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = errors.Join(err, ctx.Err())
		}
		t.Fatalf("node --test %s: %v (pass %d, fail %d)\n%s\n%s", file, err, counts["pass"], counts["fail"], out.String(), logs())
	}
	t.Logf("node --test %s: %d passed", file, counts["pass"])
}

// TestWebMCPWithTypeScriptSDK drives /mcp, /mcp-no-code-execute and
// /no-code/mcp with the official MCP TypeScript SDK
// (edge/web/test/mcp.test.mjs), and the resources of /mcp through a second
// edge with API keys for two tenants, which read each other's resources in
// vain.
func TestWebMCPWithTypeScriptSDK(t *testing.T) {
	t.Parallel()
	dir := webDir(t, "@modelcontextprotocol/sdk")
	s := shared(t)
	keyA, keyB := "k-alpha-"+newSecret()[:16], "k-beta-"+newSecret()[:16]
	keys := filepath.Join(t.TempDir(), "keys.json")
	if err := os.WriteFile(keys, []byte(`{"`+keyA+`": "alpha", "`+keyB+`": "beta"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	keyed, err := s.StartEdge(nil, "--api-keys", keys)
	if err != nil {
		t.Fatalf("start edge with API keys: %v", err)
	}
	t.Cleanup(func() { _ = keyed.Stop(30 * time.Second) })
	logs := func() string { return s.Logs() + "--- edge with API keys ---\n" + keyed.Logs() }
	nodeTest(t, dir, "mcp.test.mjs", s.Edge.URL(), logs, "CODEMODE_EDGE_BIN="+filepath.Join(binDir, "edge"),
		"CODEMODE_KEYED_EDGE_URL="+keyed.URL(), "CODEMODE_API_KEY_A="+keyA, "CODEMODE_API_KEY_B="+keyB)
}

// TestWebPlaygroundInChromium loads the playground from the edge in Debian's
// Chromium and runs code through it over gRPC-Web
// (edge/web/test/browser.test.mjs). It leaves a screenshot at
// $CODEMODE_SCREENSHOT when that is set, else in the test's temp dir.
func TestWebPlaygroundInChromium(t *testing.T) {
	t.Parallel()
	dir := webDir(t, "playwright-core")
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("%s is missing: run %s (it runs apt-get install -y chromium)", chromiumPath, webSetup)
	}
	s := shared(t)
	shot := os.Getenv("CODEMODE_SCREENSHOT")
	if shot == "" {
		shot = filepath.Join(t.TempDir(), "playground.png")
	}
	nodeTest(t, dir, "browser.test.mjs", s.Edge.URL(), s.Logs, "CHROMIUM="+chromiumPath, "CODEMODE_SCREENSHOT="+shot)
	// The second shows a run's matplotlib figure.
	for _, f := range []string{shot, strings.TrimSuffix(shot, ".png") + "-artifacts.png"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("no screenshot: %v", err)
		}
		if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) || len(b) < 10_000 {
			t.Fatalf("screenshot %s is not a PNG of a rendered page (%d bytes)", f, len(b))
		}
		t.Logf("screenshot: %s", f)
	}
}

// TestWebWithAPIKeys starts a second edge that requires API keys, in front of
// the shared control plane, and checks that the playground asks for a key and
// works with one, and that MCP clients need it (edge/web/test/auth.test.mjs).
func TestWebWithAPIKeys(t *testing.T) {
	t.Parallel()
	dir := webDir(t, "playwright-core", "@modelcontextprotocol/sdk")
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("%s is missing: run %s (it runs apt-get install -y chromium)", chromiumPath, webSetup)
	}
	s := shared(t)
	const key = "k-web-test-0123456789abcdef"
	keys := filepath.Join(t.TempDir(), "keys.json")
	if err := os.WriteFile(keys, []byte(`{"`+key+`": "web-test"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	edge, err := s.StartEdge(nil, "--api-keys", keys)
	if err != nil {
		t.Fatalf("start edge with API keys: %v", err)
	}
	t.Cleanup(func() { _ = edge.Stop(30 * time.Second) })
	logs := func() string { return s.Logs() + "--- edge with API keys ---\n" + edge.Logs() }
	nodeTest(t, dir, "auth.test.mjs", edge.URL(), logs, "CHROMIUM="+chromiumPath, "CODEMODE_API_KEY="+key)
}

// TestWebOtherOriginsInChromium loads a page of another origin (another
// loopback port) in Debian's Chromium and has it try every door of an edge
// without API keys: it gets nothing back and runs nothing, as the edge's
// metrics show; a page at a host name rebound to the edge is refused; an
// edge with --allowed-origins for that origin serves it; and the
// playground the edge serves still runs code
// (edge/web/test/origins.test.mjs).
func TestWebOtherOriginsInChromium(t *testing.T) {
	t.Parallel()
	dir := webDir(t, "playwright-core")
	if _, err := os.Stat(chromiumPath); err != nil {
		t.Fatalf("%s is missing: run %s (it runs apt-get install -y chromium)", chromiumPath, webSetup)
	}
	s := shared(t)
	edge, err := s.StartEdge([]string{"METRICS_ADDR=127.0.0.1:0"})
	if err != nil {
		t.Fatalf("start edge: %v", err)
	}
	t.Cleanup(func() { _ = edge.Stop(30 * time.Second) })
	pagePort := freeLoopbackPort(t)
	allowing, err := s.StartEdge(nil, "--allowed-origins", fmt.Sprintf("http://127.0.0.1:%d", pagePort))
	if err != nil {
		t.Fatalf("start edge with --allowed-origins: %v", err)
	}
	t.Cleanup(func() { _ = allowing.Stop(30 * time.Second) })
	logs := func() string {
		return s.Logs() + "--- edge ---\n" + edge.Logs() + "\n--- edge with --allowed-origins ---\n" + allowing.Logs()
	}
	nodeTest(t, dir, "origins.test.mjs", edge.URL(), logs, "CHROMIUM="+chromiumPath,
		"CODEMODE_EDGE_METRICS_URL=http://"+metricsAddr(t, edge)+"/metrics",
		fmt.Sprintf("CODEMODE_PAGE_PORT=%d", pagePort),
		"CODEMODE_ALLOWING_EDGE_URL="+allowing.URL())
}

// TestWebMCPInspectorCLI runs the MCP Inspector's CLI (edge/web's
// devDependency, the release for Node 20) as a user would, `mcp-inspector
// --cli URL --method ...`, against the edge: on /no-code/mcp it lists the
// tools without code execution and calls one; on /mcp it lists the code
// tools and runs python. Over HTTP it rewrites a URL that does not end in /mcp to /mcp,
// which is why /no-code/mcp exists: given /mcp-no-code-execute, it lists
// /mcp's tools.
func TestWebMCPInspectorCLI(t *testing.T) {
	t.Parallel()
	dir := webDir(t, "@modelcontextprotocol/inspector")
	s := shared(t)
	inspect := func(path string, args ...string) map[string]any {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(dir, "node_modules", ".bin", "mcp-inspector"),
			append([]string{"--cli", s.Edge.URL() + path}, args...)...)
		cmd.Dir = dir
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("mcp-inspector --cli %s %v: %v\n%s\n%s\n%s", path, args, err, out, stderr.String(), s.Logs())
		}
		var v map[string]any
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("mcp-inspector --cli %s %v printed no JSON: %v\n%s", path, args, err, out)
		}
		return v
	}
	toolNames := func(v map[string]any) []string {
		var names []string
		tools, _ := v["tools"].([]any)
		for _, tool := range tools {
			names = append(names, tool.(map[string]any)["name"].(string))
		}
		slices.Sort(names)
		return names
	}

	noCode := toolNames(inspect("/no-code/mcp", "--method", "tools/list"))
	if !slices.Contains(noCode, "list_languages") || !slices.Contains(noCode, "github_list_user_repos") || slices.Contains(noCode, "execute_code") {
		t.Errorf("/no-code/mcp lists %v, want the tools without code execution", noCode)
	}
	res := inspect("/no-code/mcp", "--method", "tools/call", "--tool-name", "list_languages")
	if b, _ := json.Marshal(res["structuredContent"]); res["isError"] == true || !strings.Contains(string(b), `"name":"python"`) {
		t.Errorf("list_languages on /no-code/mcp: %v", res)
	}
	code := toolNames(inspect("/mcp", "--method", "tools/list"))
	if !slices.Contains(code, "execute_code") || slices.Contains(code, "github_list_user_repos") {
		t.Errorf("/mcp lists %v, want the code tools", code)
	}
	res = inspect("/mcp", "--method", "tools/call", "--tool-name", "execute_code", "--tool-arg", "code=print(6*7)")
	if sc, _ := res["structuredContent"].(map[string]any); res["isError"] == true || sc["stdout"] != "42\n" {
		t.Errorf("execute_code on /mcp: %v", res)
	}
	// Without --transport it takes that path for SSE, which no door speaks.
	if got := toolNames(inspect("/mcp-no-code-execute", "--transport", "http", "--method", "tools/list")); !slices.Equal(got, code) {
		t.Errorf("the Inspector, given /mcp-no-code-execute, lists %v, not /mcp's tools: the reason for /no-code/mcp is gone", got)
	}
}
