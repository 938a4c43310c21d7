package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	"github.com/codemode-go/codemode/internal/apicatalog"
	"github.com/codemode-go/codemode/internal/testkit/apistest"
	"github.com/codemode-go/codemode/internal/testkit/dockertest"
)

// BenchmarkAPIRedaction measures what looking for a credential in API
// answers costs a call through the edge: a Python program in a sandbox
// fetches 64 KiB of JSON from a declared API with a credential (the agent's
// egress gate looks for it in every form as it forwards) and from the same
// API declared without one (nothing to look for), in turns; and, for the
// noise of a call, print(1) against print(1). Run it with
//
//	go test -run '^$' -bench APIRedaction -benchtime 40x ./edge/e2e/
func BenchmarkAPIRedaction(b *testing.B) {
	dockertest.Need(b)
	echo := apistest.NewEcho(b, "Authorization")
	dir := b.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("ghp_bench0123456789abcdefghijklmnopqrstu\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	write := func(name string, v any) string {
		p := filepath.Join(dir, name)
		writeJSON(b, p, v)
		return p
	}
	declFile := write("apicatalog.json", apicatalog.Declaration{APIs: []apicatalog.APIDeclaration{
		{Name: "cred", BaseURL: echo.URL, Credential: &apicatalog.Credential{Header: "Authorization", Prefix: "Bearer ", SecretFile: tokenFile}},
		{Name: "plain", BaseURL: echo.URL},
	}})
	const key = "k-bench-redact-0123456789"
	keys := write("keys.json", map[string]string{key: "bencher"})
	egress := write("egress.json", map[string]any{"default": map[string]any{"allow": []any{map[string]any{"host": "*.api.codemode"}}}})
	s, err := StartStack("e2e-bench-redact", "--apis", declFile)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Stop)
	edge, err := s.StartEdge(nil, "--apis", declFile, "--api-keys", keys, "--egress", egress)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = edge.Stop(30 * time.Second) })
	client := edgev1connect.NewExecutionServiceClient(httpClient, edge.URL())
	run := func(code, want string) func() {
		return func() {
			res, err := client.Execute(b.Context(), withKey(&edgev1.ExecuteRequest{Language: "python", Code: code}, key))
			if err != nil {
				b.Fatal(err)
			}
			if got := strings.TrimSpace(res.Msg.GetResult().GetStdout()); got != want {
				b.Fatalf("stdout %q, want %q; stderr %q", got, want, res.Msg.GetResult().GetStderr())
			}
		}
	}
	fetch := func(api string) string {
		return `import urllib.request; print(len(urllib.request.urlopen("http://` + api + `.api.codemode/big", timeout=30).read()))`
	}
	b.Run("fetch64KiB", func(b *testing.B) {
		pairedLatency(b, pair{"redacted", run(fetch("cred"), "65536")}, pair{"plain", run(fetch("plain"), "65536")})
	})
	b.Run("print1", func(b *testing.B) {
		pairedLatency(b, pair{"a", run("print(1)", "1")}, pair{"b", run("print(1)", "1")})
	})
}
