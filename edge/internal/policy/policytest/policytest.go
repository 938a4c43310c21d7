// Package policytest builds the policy examples (policies/examples) and the
// edge's hostile test modules (edge/internal/policy/testdata) from source,
// once per test binary, for tests of the policy host and of the edge.
//
// Go policies are built with GOOS=wasip1 GOARCH=wasm -buildmode=c-shared
// (the go command's build cache makes repeated builds cheap); WAT modules
// with wat2wasm, which must be on PATH (Debian package wabt).
package policytest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/codemode-go/codemode/internal/testkit"
	"github.com/codemode-go/codemode/internal/testkit/testenv"
)

// GoExamples are the Go example policies, by directory name.
var GoExamples = []string{"languages", "patterns", "limits", "routes", "prelude", "redact", "egress"}

// Modules are built modules by name: the examples by their directory name
// ("tenantblock" is the WAT one), the test modules by file name without
// extension ("loop", "trap", "fixed", ..., and "gohostile").
type Modules struct {
	Dir   string
	paths map[string]string
}

// Path returns the built module's path; it fails the test if there is none.
func (m *Modules) Path(t testing.TB, name string) string {
	t.Helper()
	p, ok := m.paths[name]
	if !ok {
		t.Fatalf("policytest: no module %q", name)
	}
	return p
}

var (
	once     sync.Once
	modules  *Modules
	buildErr error
	// sdkDirs are the directories BuildSDK built into, removed by Main.
	sdkDirs []string
)

// Build builds every module once per process and returns them.
func Build(t testing.TB) *Modules {
	t.Helper()
	once.Do(func() { modules, buildErr = build() })
	if buildErr != nil {
		t.Fatalf("policytest: %v", buildErr)
	}
	return modules
}

// Main runs the tests and removes the built modules.
func Main(m *testing.M) {
	code := m.Run()
	if modules != nil {
		_ = os.RemoveAll(modules.Dir)
	}
	sdkMu.Lock()
	for _, dir := range sdkDirs {
		_ = os.RemoveAll(dir)
	}
	sdkMu.Unlock()
	os.Exit(code)
}

func build() (*Modules, error) {
	dir, err := os.MkdirTemp("", "codemode-policies-")
	if err != nil {
		return nil, err
	}
	m, err := BuildInto(dir)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return m, nil
}

// BuildInto builds the named modules (all when none are named) into dir.
func BuildInto(dir string, names ...string) (*Modules, error) {
	top, err := testkit.ModuleRoot()
	if err != nil {
		return nil, err
	}
	m := &Modules{Dir: dir, paths: make(map[string]string)}
	type job struct{ name, pkg, wat string }
	var jobs []job
	for _, n := range GoExamples {
		jobs = append(jobs, job{name: n, pkg: "./policies/examples/" + n})
	}
	jobs = append(jobs,
		job{name: "gohostile", pkg: "./edge/internal/policy/testdata/gohostile"},
		job{name: "protocodec", pkg: "./policies/sdk/internal/protocodec"},
		job{name: "handcodec", pkg: "./policies/sdk/internal/handcodec"},
		job{name: "tenantblock", wat: filepath.Join(top, "policies/examples/tenantblock/tenantblock.wat")},
	)
	wats, _ := filepath.Glob(filepath.Join(top, "edge/internal/policy/testdata/*.wat"))
	for _, w := range wats {
		jobs = append(jobs, job{name: strings.TrimSuffix(filepath.Base(w), ".wat"), wat: w})
	}
	if len(names) > 0 {
		want := make(map[string]bool)
		for _, n := range names {
			want[n] = true
		}
		kept := jobs[:0]
		for _, j := range jobs {
			if want[j.name] {
				kept = append(kept, j)
				delete(want, j.name)
			}
		}
		if len(want) > 0 {
			return nil, fmt.Errorf("no such modules: %v", want)
		}
		jobs = kept
	}
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []string
	)
	sem := make(chan struct{}, 2)
	for _, j := range jobs {
		out := filepath.Join(dir, j.name+".wasm")
		m.paths[j.name] = out
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var cmd *exec.Cmd
			if j.wat != "" {
				cmd = exec.Command("wat2wasm", j.wat, "-o", out)
			} else {
				// -trimpath: the module's bytes do not depend on where the
				// repository is, so that a clone elsewhere finds its
				// compilation in the cache (see CacheDir).
				cmd = exec.Command("go", "build", "-trimpath", "-buildmode=c-shared", "-o", out, j.pkg)
				cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
			}
			cmd.Dir = top
			if b, err := cmd.CombinedOutput(); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Sprintf("build %s: %v\n%s", j.name, err, b))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return m, nil
}

// Digest returns the hex sha256 of the file at path.
func Digest(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// CacheDir returns a wazero compilation cache directory kept across test
// runs, like the go command's build cache (entries are keyed by the module's
// bytes and wazero's version), or a directory of this run when the user
// has no cache directory.
func CacheDir(t testing.TB) string {
	t.Helper()
	if base, err := os.UserCacheDir(); err == nil {
		dir := filepath.Join(base, "codemode", "wazero-test")
		if err := os.MkdirAll(dir, 0o755); err == nil {
			return dir
		}
	}
	return filepath.Join(Build(t).Dir, "cache")
}

// SDKs are the SDKs of other languages than Go, by the name of their
// directory policies/sdk-NAME, whose build.sh builds their examples into
// OUT/EXAMPLE-NAME.wasm and exits 3 when the toolchain is missing.
var SDKs = []string{"rust", "c"}

// SDKExamples are the examples each SDK of SDKs has.
var SDKExamples = map[string][]string{
	"rust": {"tenantblock", "redact", "egress"},
	"c":    {"tenantblock", "redact"},
}

var (
	sdkMu    sync.Mutex
	sdkBuilt = map[string]*sdkBuild{}
)

type sdkBuild struct {
	dir     string
	missing string // the toolchain is missing: build.sh's message
	err     error
}

// BuildSDK builds the examples of the SDK sdk ("rust", ...) once per
// process with its build.sh, as `make policies` does, and returns the
// directory holding EXAMPLE-SDK.wasm (and the SDK's test modules, such as
// fields-SDK.wasm). When the SDK's toolchain is missing it
// ends tb with testenv.Missing: a skip, or in CI a failure.
func BuildSDK(tb testing.TB, sdk string) string {
	tb.Helper()
	sdkMu.Lock()
	b, ok := sdkBuilt[sdk]
	if !ok {
		b = buildSDK(sdk)
		sdkBuilt[sdk] = b
	}
	sdkMu.Unlock()
	switch {
	case b.missing != "":
		testenv.Missing(tb, "%s (run make setup)", b.missing)
	case b.err != nil:
		tb.Fatalf("policytest: %v", b.err)
	}
	return b.dir
}

func buildSDK(sdk string) *sdkBuild {
	top, err := testkit.ModuleRoot()
	if err != nil {
		return &sdkBuild{err: err}
	}
	dir, err := os.MkdirTemp("", "codemode-policies-"+sdk+"-")
	if err != nil {
		return &sdkBuild{err: err}
	}
	sdkDirs = append(sdkDirs, dir)
	cmd := exec.Command("bash", filepath.Join(top, "policies", "sdk-"+sdk, "build.sh"), dir)
	// The SDK's test modules (testdata/) too: fields-SDK.wasm.
	cmd.Env = append(os.Environ(), "CODEMODE_SDK_TESTDATA=1")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == 3 {
		return &sdkBuild{missing: strings.TrimSpace(string(out))}
	}
	if err != nil {
		return &sdkBuild{err: fmt.Errorf("build the %s examples: %v\n%s", sdk, err, out)}
	}
	return &sdkBuild{dir: dir}
}
