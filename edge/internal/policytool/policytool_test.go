package policytool

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/codemode-go/codemode/edge/internal/policy"
	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
)

// wat builds testdata/NAME.wat into a temporary directory.
func wat(t *testing.T, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name+".wasm")
	if b, err := exec.Command("wat2wasm", filepath.Join("testdata", name+".wat"), "-o", out).CombinedOutput(); err != nil {
		t.Fatalf("wat2wasm %s: %v\n%s", name, err, b)
	}
	return out
}

// run runs `edge policy ARGS...` and returns its output and error. A
// command on a module keeps its compiled code in the tests' shared cache
// (compiling a Go module takes seconds, tens under -race).
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	if len(args) > 1 && !strings.HasPrefix(args[1], "-") {
		args = append(slices.Clip(args), "--cache-dir", policytest.CacheDir(t))
	}
	var out bytes.Buffer
	err := Run(t.Context(), args, nil, &out, &out)
	return out.String(), err
}

func TestCheckRefuses(t *testing.T) {
	t.Parallel()
	notWasm := filepath.Join(t.TempDir(), "policy.wasm")
	if err := os.WriteFile(notWasm, []byte("(module)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		module func(t *testing.T) string
		args   []string
		want   []string // in the error
	}{
		{"without the ABI's exports", func(t *testing.T) string { return wat(t, "noexports") }, nil,
			[]string{"does not export codemode_abi_version", "policies/ABI.md#exports"}},
		{"without its phase's export", func(t *testing.T) string { return policytest.Build(t).Path(t, "tenantblock") },
			[]string{"--phase", "result"}, []string{"does not export codemode_result", "policies/ABI.md#exports"}},
		{"without either phase's export", func(t *testing.T) string { return wat(t, "nophase") }, nil,
			[]string{"exports neither codemode_request nor codemode_result", "policies/ABI.md#exports"}},
		{"without the version export", func(t *testing.T) string { return wat(t, "noversion") }, nil,
			[]string{"does not export codemode_abi_version", "policies/ABI.md#exports"}},
		{"importing what the host does not offer", func(t *testing.T) string { return wat(t, "badimport") }, nil,
			[]string{"imports function env.host_log, which the host does not offer", "policies/ABI.md#imports"}},
		{"asking for more memory than allowed", func(t *testing.T) string { return wat(t, "bigmemory") }, nil,
			[]string{"asks for more memory than the policy may have (memory_limit_pages 512)", "min 1024 pages", "policies/ABI.md#what-the-host-enforces"}},
		{"not WebAssembly", func(*testing.T) string { return notWasm }, nil,
			[]string{"not a WebAssembly module", "policies/ABI.md#exports"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := tc.module(t)
			out, err := run(t, append([]string{"check", path}, tc.args...)...)
			if err == nil {
				t.Fatalf("check passed:\n%s", out)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	// More memory is fine when the configuration allows it.
	if out, err := run(t, "check", wat(t, "bigmemory"), "--memory-limit-pages", "2048"); err != nil {
		t.Errorf("bigmemory with 2048 pages: %v\n%s", err, out)
	}
}

func TestCheckAccepts(t *testing.T) {
	t.Parallel()
	mods := policytest.Build(t)
	for _, tc := range []struct{ name, config, want string }{
		{"tenantblock", "mallory", "follows policy ABI v1 for phase request (calls counted in fuel)"},
		// The Go SDK exports both phases' functions.
		{"redact", "", "follows policy ABI v1 for phase request (calls counted in fuel) and result (calls counted in fuel)"},
	} {
		out, err := run(t, "check", mods.Path(t, tc.name), "--config", tc.config)
		if err != nil || !strings.Contains(out, tc.want) {
			t.Errorf("check %s = %q, %v; want %q", tc.name, out, err, tc.want)
		}
	}
	// A configuration the module's init refuses.
	_, err := run(t, "check", mods.Path(t, "egress"), "--config", "bob: teleport")
	if err == nil || !strings.Contains(err.Error(), `unknown directive "teleport"`) {
		t.Errorf("egress with a bad config: %v", err)
	}
}

// TestRunCases runs the examples' own case files (they pass: exit 0) and
// one with a wrong expectation (it fails: a non-zero exit).
func TestRunCases(t *testing.T) {
	t.Parallel()
	top := moduleRoot(t)
	tenantblock := policytest.Build(t).Path(t, "tenantblock")
	cases := filepath.Join(top, "policies", "conformance", "tenantblock.json")
	out, err := run(t, "run", tenantblock, "--cases", cases)
	if err != nil {
		t.Fatalf("the example's own cases: %v\n%s", err, out)
	}
	if !strings.Contains(out, "all 7 cases passed") || !strings.Contains(out, "fuel ") {
		t.Errorf("output does not report the cases and their fuel:\n%s", out)
	}

	wrong := filepath.Join(t.TempDir(), "wrong.json")
	if err := os.WriteFile(wrong, []byte(`{"phase": "request", "config": "mallory", "cases": [
		{"name": "right", "input": {"tenant": "mallory"}, "want": {"verdict": "deny"}},
		{"name": "wrong verdict", "input": {"tenant": "alice"}, "want": {"verdict": "deny"}},
		{"name": "wrong reason", "input": {"tenant": "mallory"}, "want": {"verdict": "deny", "reason": "go away"}}
	]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "run", tenantblock, "--cases", wrong)
	if err == nil || !strings.Contains(err.Error(), "2 of 3 cases failed") {
		t.Fatalf("wrong expectations: err = %v, want 2 of 3 cases failed\n%s", err, out)
	}
	for _, w := range []string{"verdict allow, want deny", `reason "tenant is suspended by the tenant policy", want "go away"`} {
		if !strings.Contains(out, w) {
			t.Errorf("output does not say %q:\n%s", w, out)
		}
	}
}

// TestRunInput runs one input and prints the decision, the host's
// outcome, fuel and time.
func TestRunInput(t *testing.T) {
	t.Parallel()
	in := filepath.Join(t.TempDir(), "in.json")
	if err := os.WriteFile(in, []byte(`{"result": {"stdout": "key AKIAIOSFODNN7EXAMPLE"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "run", policytest.Build(t).Path(t, "redact"), "--phase", "result", "--input", in)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"verdict:     allow",
		`"redactions":[{"stream":"STREAM_STDOUT","start":4,"end":24,"replacement":"[REDACTED aws-access-key-id]"}]`,
		`result:      {"stdout":"key [REDACTED aws-access-key-id]"}`,
		"cost:        fuel ",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output does not say %q:\n%s", w, out)
		}
	}
}

func TestBench(t *testing.T) {
	t.Parallel()
	in := filepath.Join(t.TempDir(), "in.json")
	if err := os.WriteFile(in, []byte(`{"tenant": "mallory", "execution": {"language": "python", "code": "print(1)"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "bench", policytest.Build(t).Path(t, "tenantblock"), "--config", "mallory", "--input", in, "-n", "200")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"200 calls, verdict deny", "call time: p50 ", " p90 ", " p99 ", " max ", "fuel:      "} {
		if !strings.Contains(out, w) {
			t.Errorf("output does not say %q:\n%s", w, out)
		}
	}
}

// TestABISectionsExist checks that the sections of ABI.md the engine's
// errors point to are headings there.
func TestABISectionsExist(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(moduleRoot(t), "policies", "ABI.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			a := strings.Map(func(r rune) rune {
				switch {
				case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
					return r
				case r == ' ':
					return '-'
				}
				return -1
			}, strings.ToLower(h))
			anchors[a] = true
		}
	}
	for _, s := range []string{policy.ABIExports, policy.ABIImports, policy.ABIEnforced} {
		if !anchors[s] {
			t.Errorf("ABI.md has no section #%s (it has %v)", s, anchors)
		}
	}
}
