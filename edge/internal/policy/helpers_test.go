package policy

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestMain(m *testing.M) { policytest.Main(m) }

// pol returns the configuration of the built module name.
func pol(t testing.TB, name, phase string, order int, config string) PolicyConfig {
	t.Helper()
	mods := policytest.Build(t)
	path := mods.Path(t, name)
	return PolicyConfig{
		Name: name, Path: path, SHA256: policytest.Digest(t, path),
		Phase: phase, Order: order, Config: config,
	}
}

// fixed returns the configuration of the fixed-answer module answering d.
func fixed(t testing.TB, name string, order int, d proto.Message) PolicyConfig {
	t.Helper()
	b, err := proto.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return fixedBytes(t, name, order, b)
}

func fixedBytes(t testing.TB, name string, order int, b []byte) PolicyConfig {
	p := pol(t, "fixed", PhaseRequest, order, "")
	p.Name = name
	p.ConfigBase64 = base64.StdEncoding.EncodeToString(b)
	return p
}

// writeConfig writes cfg as a configuration file and returns its path.
func writeConfig(t testing.TB, path string, cfg Config) string {
	t.Helper()
	if path == "" {
		path = filepath.Join(t.TempDir(), "policies.json")
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// newEngine loads cfg into a new engine closed at the end of the test.
// Unless the test sets them, fuel and the deadline are the defaults: fuel
// does not run out while -race on a loaded machine starves a call, and the
// 10 s backstop is not reached either. The deadline tests set theirs.
func newEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	return newEngineWith(t, cfg, false)
}

// newEngineWith is newEngine, with wazero's context interruption for every
// module when contextInterrupt is set.
func newEngineWith(t testing.TB, cfg Config, contextInterrupt bool) *Engine {
	t.Helper()
	opts := testOptions(t, writeConfig(t, "", cfg))
	opts.ContextInterrupt = contextInterrupt
	e, err := New(context.Background(), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

func req(tenant, language, code string) RequestInput {
	return RequestInput{
		Execution: &executionv1.Execution{Language: language, Code: code},
		Tenant:    tenant, Door: "connect", RequestID: "r1",
	}
}

func withTimeout(in RequestInput, d time.Duration) RequestInput {
	in.Execution.Timeout = durationpb.New(d)
	return in
}

// wantDenial fails unless err is a denial by policy with reason.
func wantDenial(t *testing.T, err error, policy, reason string, cause policyv1.Cause) {
	t.Helper()
	d, ok := err.(*Denial)
	if !ok {
		t.Fatalf("err = %v, want a denial by %s", err, policy)
	}
	if d.Policy != policy || d.Reason != reason || d.Cause != cause {
		t.Fatalf("denial = %+v, want policy %q reason %q cause %v", d, policy, reason, cause)
	}
}

func countersOf(t *testing.T, e *Engine, name string) *policyv1.PolicyCounters {
	t.Helper()
	for _, p := range e.Status().Policies {
		if p.Name == name {
			return p.Counters
		}
	}
	t.Fatalf("no policy %s in status", name)
	return nil
}

// testOptions shares one compilation cache directory across tests and test
// runs, so that each module compiles once (compiling the Go examples takes
// seconds, tens of seconds under -race).
func testOptions(t testing.TB, path string) Options {
	return Options{ConfigPath: path, CacheDir: policytest.CacheDir(t), KnownLanguage: testLanguage}
}

// testLanguage stands for the agents' language table, as the edge passes it.
func testLanguage(name string) bool {
	switch name {
	case "python", "python3", "bash", "sh", "javascript":
		return true
	}
	return false
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
