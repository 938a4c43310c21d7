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

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/codemode-go/codemode/internal/apicatalog"
	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/apistest"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
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
	dockertest.Need(t)
	fake := apistest.NewGitHub(t)
	const token, key = codeModeToken, codeModeKey
	s, edge := startCodeModeStack(t, fake.URL)
	logs := func() string { return s.Logs() + "\n" + edge.Logs() }

	// The direct way.
	direct := call(t, keySession(t, edge.URL()+"/mcp-no-code-execute", key), "github_list_user_repos", map[string]any{"username": "octocat"})
	if direct.IsError {
		t.Fatalf("github_list_user_repos: %s", testkit.ToolText(direct))
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
		t.Fatalf("execute_code: %s\n%s", testkit.ToolText(res), logs())
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
	checkFakeSawToken(t, fake, token)

	// The secret is nowhere in the sandbox. The program looks for it
	// without holding it in its code: it gets it reversed.
	search := sandboxSearch(reverse(token))
	for _, session := range []string{"", "codemode-search"} {
		args := map[string]any{"language": "python", "code": search}
		if session != "" {
			// A session that called the API first.
			call(t, cs, "execute_code", map[string]any{"language": "python", "code": code, "session_id": session})
			args["session_id"] = session
		}
		r := call(t, cs, "execute_code", args)
		if got := testkit.ToolText(r); !strings.Contains(got, "found: [] environ: False control: ['/tmp/control']") {
			t.Errorf("search in the sandbox (session %q): %s", session, got)
		}
	}
	for _, text := range []string{testkit.ToolText(res), stdout, logs()} {
		if strings.Contains(text, token) {
			t.Fatal("the token is in a result or a log")
		}
	}

	t.Run("echoes", func(t *testing.T) { codeModeEchoes(t, cs) })
	if strings.Contains(logs(), echoToken) {
		t.Error("the echo token is in a log")
	}
}

// The GitHub token in TestCodeModeAPIs' declaration, and its API key.
const (
	codeModeToken = "ghp_codemode0123456789abcdefghijklmnopq"
	codeModeKey   = "k-codemode-coder-0123456789"
)

// startCodeModeStack starts a stack and an edge of it whose declaration is
// the shipped GitHub one pointed at fakeURL, with codeModeToken in a file,
// and two APIs that echo their credential (see codeModeEchoes); the API key
// codeModeKey's tenant may reach all three from code.
func startCodeModeStack(t *testing.T, fakeURL string) (*Stack, *Process) {
	t.Helper()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "github-token")
	if err := os.WriteFile(tokenFile, []byte(codeModeToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var decl apicatalog.Declaration
	if err := json.Unmarshal(apicatalog.DefaultDeclaration(), &decl); err != nil {
		t.Fatal(err)
	}
	decl.APIs[0].BaseURL = fakeURL
	decl.APIs[0].Credential = &apicatalog.Credential{Header: "Authorization", Prefix: "Bearer ", SecretFile: tokenFile}
	// And two APIs that echo their credential (see codeModeEchoes).
	echo := apistest.NewEcho(t, "Authorization")
	decl.APIs = append(decl.APIs, echoDeclaration(t, dir, echo.URL).APIs...)
	declFile := filepath.Join(dir, "apicatalog.json")
	writeJSON(t, declFile, decl)
	keys := filepath.Join(dir, "keys.json")
	writeJSON(t, keys, map[string]string{codeModeKey: "coder"})
	egressFile := filepath.Join(dir, "egress.json")
	writeJSON(t, egressFile, map[string]any{"default": map[string]any{"allow": []any{
		map[string]any{"host": "github.api.codemode"}, map[string]any{"host": "echo.api.codemode"}, map[string]any{"host": "strict.api.codemode"}}}})

	// Model-written code calls APIs with requests: its runs are forked
	// from a parent that imported it, as with the agent's defaults.
	s, err := StartStack("e2e-codemode", "--apis", declFile, "--preload=requests")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	edge, err := s.StartEdge(nil, "--apis", declFile, "--api-keys", keys, "--egress", egressFile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = edge.Stop(30 * time.Second) })
	return s, edge
}

// checkFakeSawToken checks that the fake got the four requests for the
// repositories, one direct and three from code, each with token.
func checkFakeSawToken(t *testing.T, fake *apistest.GitHub, token string) {
	t.Helper()
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

}

// sandboxSearch is a Python program that looks for a secret, given
// reversed so that the program does not hold it, in every process's
// environment and command line and in the sandbox's files, and prints what
// it found, beside a control it plants.
func sandboxSearch(reversed string) string {
	return fmt.Sprintf(`
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
`, reversed)
}

// codeModeEchoesProgram is a Python program that speaks HTTP itself to
// declared APIs, through a CONNECT tunnel of the sandbox's proxy (so that
// it gets the bytes the agent sends, with nothing in the sandbox between),
// asking for what would let an echoed credential through: gzip, trailers,
// ranges. For each form of apistest.Echo it prints one JSON line: the API,
// the form, what came (Latin-1), and that decoded (gunzipped, JSON, percent
// and HTML escapes undone, base64 decoded), as a program would decode it to
// find the token.
const codeModeEchoesProgram = `
import base64, binascii, html, json, os, re, socket, sys, urllib.parse, zlib
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])

def exchange(api, path, headers):
    s = socket.create_connection((proxy.hostname, proxy.port), timeout=30)
    host = api + ".api.codemode"
    s.sendall(("CONNECT %s:80 HTTP/1.1\r\nHost: %s:80\r\n\r\n" % (host, host)).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        c = s.recv(4096)
        if not c:
            return buf
        buf += c
    head, _, rest = buf.partition(b"\r\n\r\n")
    if b" 200" not in head.split(b"\r\n")[0]:
        return buf
    req = "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n" % (path, host)
    req += "".join("%s: %s\r\n" % kv for kv in headers.items()) + "\r\n"
    s.sendall(req.encode())
    out = rest
    while True:
        c = s.recv(65536)
        if not c:
            break
        out += c
    return out

def decode(raw):
    seen = []
    i = raw.find(b"\x1f\x8b")
    while i >= 0:
        try:
            seen.append(zlib.decompressobj(47).decompress(raw[i:]))
        except zlib.error:
            pass
        i = raw.find(b"\x1f\x8b", i + 1)
    text = raw.decode("latin-1") + " " + " ".join(b.decode("latin-1") for b in seen)
    out = [text]
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"', text):
        try:
            out.append(json.loads(m.group(0)))
        except ValueError:
            pass
    out.append(urllib.parse.unquote_plus(text))
    out.append(html.unescape(text))
    for m in re.finditer(r"[A-Za-z0-9+/_-]{16,}={0,2}", text):
        for alt in (m.group(0), m.group(0).replace("-", "+").replace("_", "/")):
            try:
                out.append(base64.b64decode(alt + "=" * (-len(alt) % 4)).decode("latin-1"))
            except (binascii.Error, ValueError):
                pass
    return " ".join(out)

def body(raw):
    head, _, rest = raw.partition(b"\r\n\r\n")
    if b"chunked" not in head.lower():
        return rest
    out = b""
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size.split(b";")[0] or b"0", 16)
        if n == 0:
            break
        out, rest = out + rest[:n], rest[n + 2:]
    return out

ask = {"Accept-Encoding": "gzip", "TE": "trailers"}
for api in ("echo", "strict"):
    for form in sys.argv[1:]:
        raw = exchange(api, "/" + form, ask)
        print(json.dumps({"api": api, "form": form, "raw": raw.decode("latin-1"), "decoded": decode(raw)}))
    pieces = b""
    for r in ("bytes=0-19", "bytes=20-39", "bytes=40-"):
        raw = exchange(api, "/range", {"Range": r})
        pieces += body(raw)
    print(json.dumps({"api": api, "form": "ranges joined", "raw": pieces.decode("latin-1"), "decoded": decode(pieces)}))
`

// codeModeEchoes runs codeModeEchoesProgram in a sandbox through the MCP
// door /mcp (cs) and checks that the program gets no form of the echo APIs'
// credential, decoded or not; and that the API declared with refuse_echo
// answers 502 to each echo.
func codeModeEchoes(t *testing.T, cs *mcp.ClientSession) {
	code := fmt.Sprintf("import sys\nsys.argv = [''] + %q.split()\n", strings.Join(apistest.EchoForms, " ")) + codeModeEchoesProgram
	res := call(t, cs, "execute_code", map[string]any{"language": "python", "code": code})
	out := structured(t, res)
	stdout, _ := out["stdout"].(string)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if res.IsError || len(lines) != 2*(len(apistest.EchoForms)+1) {
		t.Fatalf("execute_code: %d lines: %s", len(lines), testkit.ToolText(res))
	}
	find := apicatalog.NewRedactor([]byte(echoToken), false)
	for _, line := range lines {
		var got struct{ API, Form, Raw, Decoded string }
		if err := json.Unmarshal([]byte(line), &got); err != nil {
			t.Fatalf("%v: %q", err, line)
		}
		seen := got.Raw + "\n" + got.Decoded
		if find.Found([]byte(seen)) || strings.Contains(seen, "0123456789abcdefghijklmnopq") {
			t.Errorf("%s %s: the program got the token:\n%s", got.API, got.Form, seen)
		}
		status, _, _ := strings.Cut(got.Raw, "\r\n")
		switch {
		case got.API == "echo" && got.Form == "reason":
			if !strings.HasPrefix(status, "HTTP/1.1 400 ") {
				t.Errorf("echo reason: %q", status)
			}
		case got.API == "echo" || got.Form == "trailer" || got.Form == "early":
			if !strings.HasPrefix(status, "HTTP/1.1 200 ") && got.Form != "location" && got.Form != "ranges joined" {
				t.Errorf("%s %s: %q", got.API, got.Form, status)
			}
		case got.Form == "ranges joined":
			if !strings.Contains(got.Raw, "the answer echoes the API's credential and is withheld") {
				t.Errorf("strict ranges: %q", got.Raw)
			}
		default:
			if !strings.HasPrefix(status, "HTTP/1.1 502 ") || !strings.Contains(got.Raw, "codemode egress: strict: the answer echoes the API's credential and is withheld") {
				t.Errorf("strict %s: %q", got.Form, got.Raw)
			}
		}
	}
	if strings.Contains(testkit.ToolText(res), echoToken) {
		t.Error("the result holds the token")
	}
}

func reverse(s string) string {
	r := []rune(s)
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	return string(r)
}
