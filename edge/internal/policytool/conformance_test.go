package policytool

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/codemode-go/codemode/edge/internal/policy"
	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	"github.com/codemode-go/codemode/internal/testkit"
)

func TestMain(m *testing.M) { policytest.Main(m) }

// conformance lists each example's builds: the case file
// policies/conformance/EXAMPLE.json is the one table every build of the
// example must pass, through the edge's own engine.
var conformance = []struct {
	example string
	// goBuild: policies/examples/EXAMPLE is a Go build of it (a WAT one
	// for tenantblock).
	goBuild bool
}{
	{"tenantblock", true},
	{"redact", true},
	{"egress", true},
}

// TestConformance runs every build of each example, in every language
// that has one, through its table of cases.
func TestConformance(t *testing.T) {
	top := moduleRoot(t)
	goMods, err := policytest.BuildInto(t.TempDir(), "tenantblock", "redact", "egress")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conformance {
		cases, err := ReadCases(filepath.Join(top, "policies", "conformance", c.example+".json"))
		if err != nil {
			t.Fatal(err)
		}
		builds := map[string]func(t *testing.T) string{}
		if c.goBuild {
			lang := "go"
			if c.example == "tenantblock" {
				lang = "wat"
			}
			builds[lang] = func(t *testing.T) string { return goMods.Path(t, c.example) }
		}
		for _, sdk := range policytest.SDKs {
			for _, e := range policytest.SDKExamples[sdk] {
				if e == c.example {
					builds[sdk] = func(t *testing.T) string {
						return filepath.Join(policytest.BuildSDK(t, sdk), e+"-"+sdk+".wasm")
					}
				}
			}
		}
		for lang, path := range builds {
			t.Run(c.example+"/"+lang, func(t *testing.T) {
				s := setup{module: path(t), phase: cases.Phase, config: cases.Config, labels: cases.Labels,
					memoryPages: policy.DefaultMemoryLimitPages, fuel: policy.DefaultFuel,
					cacheDir: policytest.CacheDir(t)}
				var out bytes.Buffer
				failed, err := RunCases(t.Context(), s, cases, &out)
				if err != nil {
					t.Fatal(err)
				}
				if failed > 0 {
					t.Errorf("%d of %d cases failed:\n%s", failed, len(cases.Cases), out.String())
				}
			})
		}
	}
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := testkit.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestSDKBuildScripts builds each SDK's examples as make policies does,
// into a directory named relative to the caller's.
func TestSDKBuildScripts(t *testing.T) {
	top := moduleRoot(t)
	for _, sdk := range policytest.SDKs {
		t.Run(sdk, func(t *testing.T) {
			policytest.BuildSDK(t, sdk) // ends the test when the toolchain is missing
			dir := t.TempDir()
			cmd := exec.Command("bash", filepath.Join(top, "policies", "sdk-"+sdk, "build.sh"), "out")
			cmd.Dir = dir
			if b, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("build.sh out: %v\n%s", err, b)
			}
			for _, e := range policytest.SDKExamples[sdk] {
				if _, err := os.Stat(filepath.Join(dir, "out", e+"-"+sdk+".wasm")); err != nil {
					t.Errorf("build.sh out did not build %s into out: %v", e, err)
				}
			}
		})
	}
}

// TestSDKCodecs runs each SDK's test modules through the engine: fields
// annotates a request or result with every field it decoded, on inputs that
// set every field (testdata/fields*.json); decisions answers a decision
// made with each helper, which the host must decode and apply
// (testdata/decisions*.json).
func TestSDKCodecs(t *testing.T) {
	for _, sdk := range policytest.SDKs {
		for _, file := range []string{"fields.json", "fields-result.json", "decisions.json", "decisions-result.json"} {
			t.Run(sdk+"/"+file, func(t *testing.T) {
				cases, err := ReadCases(filepath.Join("testdata", file))
				if err != nil {
					t.Fatal(err)
				}
				module := strings.SplitN(strings.TrimSuffix(file, ".json"), "-", 2)[0]
				s := setup{module: filepath.Join(policytest.BuildSDK(t, sdk), module+"-"+sdk+".wasm"), phase: cases.Phase, labels: cases.Labels,
					memoryPages: policy.DefaultMemoryLimitPages, fuel: policy.DefaultFuel, cacheDir: policytest.CacheDir(t)}
				var out bytes.Buffer
				failed, err := RunCases(t.Context(), s, cases, &out)
				if err != nil {
					t.Fatal(err)
				}
				if failed > 0 {
					t.Errorf("%d of %d cases failed:\n%s", failed, len(cases.Cases), out.String())
				}
			})
		}
	}
}
