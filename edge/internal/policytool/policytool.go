// Package policytool is `edge policy`, the policy author's tool: check a
// module against the ABI (policies/ABI.md), run it on inputs (or on a list
// of cases with the decisions they expect) and benchmark its calls. It
// loads modules with the edge's own policy engine (package policy), so a
// module behaves here exactly as in the edge's chain: the same loading,
// instrumentation, fuel, limits and decision checks.
package policytool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/codemode-go/codemode/edge/internal/policy"
	"github.com/codemode-go/codemode/internal/cli"
)

// Command is the edge's subcommand that runs this tool.
const Command = "policy"

// Run is `edge policy check|run|bench ...`.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	usage := func() {
		fmt.Fprintf(stderr, `Usage:
  edge policy check MODULE.wasm [flags]   does the module follow the ABI (policies/ABI.md)?
  edge policy run MODULE.wasm [flags]     run it on --input, or on --cases with the decisions they expect
  edge policy bench MODULE.wasm [flags]   time its calls on --input: percentiles and fuel

See edge policy COMMAND --help for the flags of each.
`)
	}
	if len(args) == 0 {
		usage()
		return errors.New("edge policy: want a command: check, run or bench")
	}
	switch args[0] {
	case "check":
		return runCheck(ctx, args[1:], stdout, stderr)
	case "run":
		return runCases(ctx, args[1:], stdout, stderr)
	case "bench":
		return runBench(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		usage()
		return nil
	}
	usage()
	return fmt.Errorf("edge policy: unknown command %q: want check, run or bench", args[0])
}

// moduleFlags are the flags every command has: what the edge's
// configuration would say of the policy.
type moduleFlags struct {
	phase, config   *string
	memoryPages     *uint
	fuel            *uint64
	labels          *string
	cacheDir        *string
	fs              *cli.Flags
	module          string
	requirePhaseSet bool
}

func newFlags(name string, stderr io.Writer) *moduleFlags {
	fs := cli.NewFlags("edge policy "+name, stderr)
	f := &moduleFlags{fs: fs}
	f.phase = fs.String("phase", "", "phase the module is for: request or result (check: empty tries both)")
	fs.Env("phase", "CODEMODE_POLICY_PHASE")
	f.config = fs.String("config", "", "configuration bytes given to the module's codemode_init, as in the edge's policies[].config")
	fs.Env("config", "CODEMODE_POLICY_MODULE_CONFIG")
	f.memoryPages = fs.Uint("memory-limit-pages", policy.DefaultMemoryLimitPages, "memory cap per instance, in 64 KiB pages, as policies[].memory_limit_pages")
	fs.Env("memory-limit-pages", "CODEMODE_POLICY_MEMORY_LIMIT_PAGES")
	f.fuel = fs.Uint64("fuel", policy.DefaultFuel, "fuel of a call (plus fuel_per_input_byte per input byte), as the configuration's fuel")
	fs.Env("fuel", "CODEMODE_POLICY_FUEL")
	f.labels = fs.String("labels", "", "route labels the module may set, as KEY=V1|V2,KEY2 (a key alone: any value)")
	fs.Env("labels", "CODEMODE_POLICY_LABELS")
	f.cacheDir = fs.String("cache-dir", "", "directory that keeps compiled modules across runs, as the edge's --policy-cache-dir; empty: compile on every run")
	fs.Env("cache-dir", "CODEMODE_POLICY_CACHE_DIR")
	return f
}

// parse parses args: the module's path first, then flags.
func (f *moduleFlags) parse(args []string) error {
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		f.module, args = args[0], args[1:]
	}
	if err := f.fs.Parse(args, os.Getenv); err != nil {
		return err
	}
	if f.module == "" {
		return fmt.Errorf("%s: want the module's path first", f.fs.Name())
	}
	switch *f.phase {
	case "", policy.PhaseRequest, policy.PhaseResult:
	default:
		return fmt.Errorf("--phase must be %q or %q", policy.PhaseRequest, policy.PhaseResult)
	}
	return nil
}

// loaded is a module loaded by the edge's engine, alone in its chain.
type loaded struct {
	engine  *policy.Engine
	phase   string
	dir     string
	reports chan policy.CallReport
}

// setup says how to load a module.
type setup struct {
	module, phase, config string
	memoryPages           uint32
	fuel                  uint64
	labels                map[string][]string
	poolSize              int
	// cacheDir keeps compiled code across runs; empty: memory only.
	cacheDir string
}

// load writes a one-policy configuration for s and loads it with the
// edge's engine.
func load(ctx context.Context, s setup) (*loaded, error) {
	path, err := filepath.Abs(s.module)
	if err != nil {
		return nil, fmt.Errorf("find module: %w", err)
	}
	code, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read module: %w", err)
	}
	sum := sha256.Sum256(code)
	dir, err := os.MkdirTemp("", "codemode-policy-tool-")
	if err != nil {
		return nil, fmt.Errorf("make temporary directory: %w", err)
	}
	name := policyName(path)
	cfg := policy.Config{
		Fuel:   s.fuel,
		Labels: s.labels,
		Policies: []policy.PolicyConfig{{
			Name: name, Path: path, SHA256: hex.EncodeToString(sum[:]), Phase: s.phase,
			Config: s.config, MemoryLimitPages: s.memoryPages, PoolSize: max(s.poolSize, 1),
		}},
	}
	l := &loaded{phase: s.phase, dir: dir, reports: make(chan policy.CallReport, 1)}
	configPath := filepath.Join(dir, "policies.json")
	if err := writeJSON(configPath, cfg); err != nil {
		l.close(ctx)
		return nil, err
	}
	e, err := policy.New(ctx, policy.Options{ConfigPath: configPath, CacheDir: s.cacheDir, OnCall: l.report})
	if err != nil {
		l.close(ctx)
		return nil, err
	}
	l.engine = e
	return l, nil
}

// policyName names the policy in messages after its file: "redact" for
// redact.wasm.
func policyName(path string) string {
	base := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	name := []byte(base)
	for i, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || i > 0 && (c == '_' || c == '.' || c == '-')
		if !ok {
			name[i] = '-'
		}
	}
	if len(name) == 0 || name[0] == '-' || len(name) > 63 {
		return "policy"
	}
	return string(name)
}

// report keeps the last call's report; calls run one at a time here.
func (l *loaded) report(r policy.CallReport) {
	select {
	case <-l.reports:
	default:
	}
	l.reports <- r
}

// lastReport returns the report of the call just made, if there was one.
func (l *loaded) lastReport() (policy.CallReport, bool) {
	select {
	case r := <-l.reports:
		return r, true
	default:
		return policy.CallReport{}, false
	}
}

func (l *loaded) close(ctx context.Context) {
	if l.engine != nil {
		_ = l.engine.Close(context.WithoutCancel(ctx))
	}
	_ = os.RemoveAll(l.dir)
}

func (f *moduleFlags) setup(phase string) (setup, error) {
	labels, err := parseLabels(*f.labels)
	if err != nil {
		return setup{}, err
	}
	return setup{
		module: f.module, phase: phase, config: *f.config,
		memoryPages: uint32(*f.memoryPages), fuel: *f.fuel, labels: labels,
		cacheDir: *f.cacheDir,
	}, nil
}
