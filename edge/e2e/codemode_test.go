package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/codemode-go/codemode/internal/apis"
	"github.com/codemode-go/codemode/internal/apis/apistest"
)

// TestCodeModeAPIs compares the original's two ways on the same declared
// API, a fake GitHub on loopback whose token is in a file that only the
// edge and the agent read: a direct tool call on /mcp-no-code-execute, and
// code on /mcp that calls http://github.api.codemode/, which the agent
// forwards with the token. Both get the same data; the fake sees the token
// both times; the sandbox never holds it: not in any process's environment
// or command line, not in a writable file, not in the run's output.
func TestCodeModeAPIs(t *testing.T) {
	t.Parallel()
	needDocker(t)
	fake := apistest.NewGitHub(t)
	dir := t.TempDir()
	const token = "ghp_codemode0123456789abcdefghijklmnopq"
	tokenFile := filepath.Join(dir, "github-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var decl apis.Declaration
	if err := json.Unmarshal(apis.DefaultDeclaration(), &decl); err != nil {
		t.Fatal(err)
	}
	decl.APIs[0].BaseURL = fake.URL
	decl.APIs[0].Credential = &apis.Credential{Header: "Authorization", Prefix: "Bearer ", SecretFile: tokenFile}
	declFile := filepath.Join(dir, "apis.json")
	writeJSON(t, declFile, decl)
	const key = "k-codemode-coder-0123456789"
	keys := filepath.Join(dir, "keys.json")
	writeJSON(t, keys, map[string]string{key: "coder"})
	egressFile := filepath.Join(dir, "egress.json")
	writeJSON(t, egressFile, map[string]any{"default": map[string]any{"allow": []any{map[string]any{"host": "github.api.codemode"}}}})

	s, err := StartStack("e2e-codemode", "--apis", declFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	edge, err := s.StartEdge(nil, "--apis", declFile, "--api-keys", keys, "--egress", egressFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = edge.Stop(30 * time.Second) })
	logs := func() string { return s.Logs() + "\n" + edge.Logs() }

	// The direct way.
	direct := call(t, keySession(t, edge.URL()+"/mcp-no-code-execute", key), "github_list_user_repos", map[string]any{"username": "octocat"})
	if direct.IsError {
		t.Fatalf("github_list_user_repos: %s", textOf(direct))
	}
	want := structured(t, direct)["body"]

	// Code mode, three clients in one program: Python requests, curl and
	// Node's fetch, each printing the JSON it got on a line of its own.
	const url = "http://github.api.codemode/users/octocat/repos?type=owner&sort=full_name&per_page=30&page=1"
	code := fmt.Sprintf(`
import json, subprocess, requests
print(json.dumps(requests.get(%[1]q, timeout=20).json()))
print(subprocess.run(["curl", "-sS", %[1]q], capture_output=True, text=True).stdout.replace("\n", " "))
print(subprocess.run(["node", "-e", "fetch('%[2]s').then(r => r.json()).then(j => console.log(JSON.stringify(j)))"], capture_output=True, text=True).stdout.strip())
`, url, url)
	cs := keySession(t, edge.URL()+"/mcp", key)
	res := call(t, cs, "execute_code", map[string]any{"language": "python", "code": code})
	out := structured(t, res)
	stdout, _ := out["stdout"].(string)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if res.IsError || len(lines) != 3 {
		t.Fatalf("execute_code: %s\n%s", textOf(res), logs())
	}
	for i, client := range []string{"requests", "curl", "fetch"} {
		var got any
		if err := json.Unmarshal([]byte(lines[i]), &got); err != nil {
			t.Errorf("%s: %v: %q", client, err, lines[i])
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s got %v\nthe direct tool got %v", client, got, want)
		}
	}
	// Plain-HTTP requests of one run to one host may share a connection
	// (the runner's proxy keeps it open); fetch tunnels its own.
	if e, _ := out["egress"].(map[string]any); e["connections"] == nil || e["connections"].(float64) < 2 || e["refused"] != nil {
		t.Errorf("egress report %v: want 2 connections or 3, none refused", out["egress"])
	}
	n := 0
	for _, r := range fake.Requests() {
		if r.Path == "/users/octocat/repos" {
			n++
			if got := r.Header.Get("Authorization"); got != "Bearer "+token {
				t.Errorf("the fake got Authorization %q", got)
			}
		}
	}
	if n != 4 {
		t.Errorf("the fake got %d requests for the repositories, want 4 (one direct, three from code)", n)
	}

	// The secret is nowhere in the sandbox. The program looks for it
	// without holding it in its code: it gets it reversed.
	search := fmt.Sprintf(`
import glob, os
def scan(needle):
    found = []
    for p in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
        try:
            if needle in open(p, "rb").read():
                found.append(p)
        except OSError:
            pass
    for top in ("/workspace", "/tmp", "/dev/shm", "/opt/codemode", "/etc", "/var", "/root", "/home"):
        for d, _, files in os.walk(top):
            for f in files:
                p = os.path.join(d, f)
                try:
                    if os.path.isfile(p) and not os.path.islink(p) and needle in open(p, "rb").read():
                        found.append(p)
                except OSError:
                    pass
    return found
secret = %q[::-1].encode()
# The scan finds what is there: a control planted in a file.
control = "-".join(["control", str(os.getpid())]).encode()
open("/tmp/control", "wb").write(control)
print("found:", scan(secret), "environ:", secret in b"".join(k.encode() + v.encode() for k, v in os.environ.items()),
      "control:", scan(control))
`, reverse(token))
	for _, session := range []string{"", "codemode-search"} {
		args := map[string]any{"language": "python", "code": search}
		if session != "" {
			// A session that called the API first.
			call(t, cs, "execute_code", map[string]any{"language": "python", "code": code, "session_id": session})
			args["session_id"] = session
		}
		r := call(t, cs, "execute_code", args)
		if got := textOf(r); !strings.Contains(got, "found: [] environ: False control: ['/tmp/control']") {
			t.Errorf("search in the sandbox (session %q): %s", session, got)
		}
	}
	for _, text := range []string{textOf(res), stdout, logs()} {
		if strings.Contains(text, token) {
			t.Fatal("the token is in a result or a log")
		}
	}
}

func reverse(s string) string {
	r := []rune(s)
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	return string(r)
}
