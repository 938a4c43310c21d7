package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// egressProbe times GETs over fresh connections and one 50 MB download, in
// Python, with raw sockets so that the same code runs in a sandbox (through
// the egress proxy: a CONNECT, then the request) and on the host (directly).
// It prints a JSON object: the seconds of each GET by kind, and the
// download's seconds.
const egressProbe = `
import json, os, socket, ssl, sys, time
cfg = json.loads(sys.argv[1])
ctx = ssl.create_default_context(cafile=cfg["ca"])
proxy = os.environ.get("HTTP_PROXY")
def connect(host, port):
    if not proxy:
        return socket.create_connection(("127.0.0.1", port))
    ph, pp = proxy.rsplit("/", 1)[-1].rsplit(":", 1)
    s = socket.create_connection((ph, int(pp)))
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(4096)
        if not c:
            raise SystemExit("proxy closed: %r" % head)
        head += c
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit("proxy refused: %r" % head)
    return s
def get(host, port, path, tls):
    s = connect(host, port)
    if tls:
        s = ctx.wrap_socket(s, server_hostname=host)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    n = 0
    while True:
        c = s.recv(1 << 20)
        if not c:
            break
        n += len(c)
    s.close()
    return n
out = {"http": [], "https": []}
for _ in range(cfg["n"]):
    for kind, host, port, tls in (("http", "plain.test", cfg["http"], False), ("https", "secure.test", cfg["https"], True)):
        t = time.perf_counter()
        if get(host, port, "/", tls) < 20:
            raise SystemExit("short answer")
        out[kind].append(time.perf_counter() - t)
t = time.perf_counter()
n = get("plain.test", cfg["http"], "/50mb", False)
out["download"] = time.perf_counter() - t
out["download_bytes"] = n
print(json.dumps(out))
`

type probeResult struct {
	HTTP, HTTPS   []float64
	Download      float64
	DownloadBytes int64 `json:"download_bytes"`
}

// BenchmarkEgress compares a small GET and a 50 MB download through the
// egress path (a program in a sandbox, the runner's proxy, the tunnel over
// the runner's stream, the agent's decision and dial) with the same from
// the host, in the same run. Run it with -benchtime 1x and -count for the
// spread:
//
//	go test -run '^$' -bench Egress -benchtime 1x -count 3 ./edge/e2e/
func BenchmarkEgress(b *testing.B) {
	es := startEgressStack(b)
	const n = 200
	cfg := func(ca string) string {
		j, _ := json.Marshal(map[string]any{"ca": ca, "n": n, "http": atoi(es.httpPort), "https": atoi(es.httpsPort)})
		return string(j)
	}
	caFile := filepath.Join(b.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, es.caPEM, 0o644); err != nil {
		b.Fatal(err)
	}
	hostProbe := func() probeResult {
		cmd := exec.Command("python3", "-c", egressProbe, cfg(caFile))
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("host probe: %v: %s", err, out)
		}
		var r probeResult
		if err := json.Unmarshal(out, &r); err != nil {
			b.Fatalf("host probe: %v: %s", err, out)
		}
		return r
	}
	sandboxProbe := func() probeResult {
		code := fmt.Sprintf("import subprocess, sys\nsys.exit(subprocess.run([sys.executable, '-c', %q, %q]).returncode)", egressProbe, cfg("/workspace/ca.pem"))
		req := &edgev1.ExecuteRequest{Language: "python", Code: code, Timeout: durationpb.New(3 * time.Minute),
			Files: []*executionv1.File{{Path: "ca.pem", Content: es.caPEM}}}
		res, err := es.client.Execute(b.Context(), withKey(req, keyEgressAlice))
		if err != nil {
			b.Fatal(err)
		}
		var r probeResult
		if err := json.Unmarshal([]byte(res.Msg.GetResult().GetStdout()), &r); err != nil {
			b.Fatalf("sandbox probe: %v: stdout %q, stderr %q", err, res.Msg.GetResult().GetStdout(), res.Msg.GetResult().GetStderr())
		}
		return r
	}
	for b.Loop() {
		host, sb := hostProbe(), sandboxProbe()
		if sb.DownloadBytes < 50<<20 || host.DownloadBytes < 50<<20 {
			b.Fatalf("download of %d bytes in the sandbox, %d on the host", sb.DownloadBytes, host.DownloadBytes)
		}
		for _, kind := range []string{"http", "https"} {
			h, s := host.HTTP, sb.HTTP
			if kind == "https" {
				h, s = host.HTTPS, sb.HTTPS
			}
			hp50, hp95, sp50, sp95 := pctMS(h, 50), pctMS(h, 95), pctMS(s, 50), pctMS(s, 95)
			b.ReportMetric(sp50, kind+"-egress-p50-ms")
			b.ReportMetric(sp95, kind+"-egress-p95-ms")
			b.ReportMetric(hp50, kind+"-host-p50-ms")
			b.ReportMetric(hp95, kind+"-host-p95-ms")
			b.ReportMetric(sp50/hp50, kind+"-p50-egress/host")
		}
		mbps := func(r probeResult) float64 { return float64(r.DownloadBytes) / (1 << 20) / r.Download }
		b.ReportMetric(mbps(sb), "50MB-egress-MiB/s")
		b.ReportMetric(mbps(host), "50MB-host-MiB/s")
		b.ReportMetric(mbps(sb)/mbps(host), "50MB-egress/host")
	}
}

func pctMS(v []float64, p int) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)*p/100] * 1000
}

func atoi(s string) int {
	var n int
	fmt.Sscan(strings.TrimSpace(s), &n)
	return n
}
