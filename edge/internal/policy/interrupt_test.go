package policy

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/codemode-go/codemode/edge/internal/policy/policytest"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// TestInstrumentEveryModule rewrites every module the tests build and checks
// that wazero still compiles it and that it exports the interrupt global.
func TestInstrumentEveryModule(t *testing.T) {
	t.Parallel()
	mods := policytest.Build(t)
	entries, err := os.ReadDir(mods.Dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".wasm") {
			continue
		}
		t.Run(e.Name(), func(t *testing.T) {
			t.Parallel()
			code, err := os.ReadFile(mods.Dir + "/" + e.Name())
			if err != nil {
				t.Fatal(err)
			}
			out, err := instrument(code)
			if e.Name() == "startloop.wasm" {
				if !errors.Is(err, errUninstrumentable) {
					t.Fatalf("instrument a module with a start section = %v, want errUninstrumentable", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("instrument: %v", err)
			}
			rt := wazero.NewRuntimeWithConfig(ctx, wazero.NewRuntimeConfigCompiler().WithCompilationCache(testCache(t)))
			defer rt.Close(ctx)
			cm, err := rt.CompileModule(ctx, out)
			if err != nil {
				t.Fatalf("compile instrumented module: %v", err)
			}
			wasi_snapshot_preview1.MustInstantiate(ctx, rt)
			mod, err := rt.InstantiateModule(ctx, cm, wazero.NewModuleConfig().WithStartFunctions())
			if err != nil {
				t.Fatalf("instantiate instrumented module: %v", err)
			}
			if g, ok := mod.ExportedGlobal(interruptExport).(api.MutableGlobal); !ok || g.Type() != api.ValueTypeI32 {
				t.Fatalf("instrumented module does not export a mutable i32 %s", interruptExport)
			}
		})
	}
}

func testCache(t *testing.T) wazero.CompilationCache {
	c, err := wazero.NewCompilationCacheWithDir(policytest.CacheDir(t))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestInterruptStopsLoop sets the global from another goroutine while the
// instrumented loop module spins, as the deadline timer does.
func TestInterruptStopsLoop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	code, err := os.ReadFile(policytest.Build(t).Path(t, "loop"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := instrument(code)
	if err != nil {
		t.Fatal(err)
	}
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	mod, err := rt.Instantiate(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	g := mod.ExportedGlobal(interruptExport).(api.MutableGlobal)
	// Garbage collections keep stopping the world while the guest spins:
	// the guest must let them (a hang here is the failure).
	stop := make(chan struct{})
	defer close(stop)
	for range 2 {
		go func() {
			for {
				select {
				case <-stop:
					return
				default:
					runtime.GC()
				}
			}
		}()
	}
	time.AfterFunc(50*time.Millisecond, func() { g.Set(1) })
	start := time.Now()
	_, err = mod.ExportedFunction("codemode_request").Call(ctx, 0)
	if err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("call = %v, want an unreachable trap", err)
	}
	t.Logf("interrupted after %v (flag set at 50ms)", time.Since(start))
}

func TestInstrumentRefuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"not wasm", []byte("hello world"), "not a WebAssembly"},
		{"truncated", []byte("\x00asm\x01\x00\x00\x00\x0a\x05\x01"), "truncated"},
		{"simd", []byte("\x00asm\x01\x00\x00\x00\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x05\x03\x01\x00\x01\x0a\x07\x01\x05\x00\xfd\x0c\x00\x0b"), "opcode 0xfd"},
		// (func (i32.const 0) (global.set 0)) with no globals: after the
		// rewrite it would clear the interrupt flag.
		{"clears the flag", []byte("\x00asm\x01\x00\x00\x00\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x05\x03\x01\x00\x01\x0a\x08\x01\x06\x00\x41\x00\x24\x00\x0b"), "global index out of range"},
		{"exports a missing global", []byte("\x00asm\x01\x00\x00\x00\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x05\x03\x01\x00\x01\x07\x05\x01\x01g\x03\x00\x0a\x04\x01\x02\x00\x0b"), "export of global index out of range"},
		{"no memory", []byte("\x00asm\x01\x00\x00\x00\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x0a\x04\x01\x02\x00\x0b"), "no memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := instrument(tc.b); !errors.Is(err, errUninstrumentable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("instrument = %v, want errUninstrumentable about %q", err, tc.want)
			}
		})
	}
}

// FuzzInstrument checks that no input makes the rewriter panic.
func FuzzInstrument(f *testing.F) {
	f.Add([]byte("\x00asm\x01\x00\x00\x00"))
	f.Add([]byte("\x00asm\x01\x00\x00\x00\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x0a\x09\x01\x07\x00\x03\x40\x0c\x00\x0b\x0b"))
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = instrument(b) })
}
