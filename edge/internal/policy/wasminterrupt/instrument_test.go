package wasminterrupt

import (
	"bytes"
	"context"
	"errors"
	"math"
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

func TestMain(m *testing.M) { policytest.Main(m) }

// TestInstrumentOneLoop checks the exact rewrite of the smallest module with
// a loop: the three globals and their exports are added, and the check is
// at the function's entry and follows the loop's block type.
func TestInstrumentOneLoop(t *testing.T) {
	t.Parallel()
	const (
		header = "\x00asm\x01\x00\x00\x00"
		types  = "\x01\x04\x01\x60\x00\x00" // one type: () -> ()
		funcs  = "\x03\x02\x01\x00"         // one function of type 0
		memory = "\x05\x03\x01\x00\x01"     // one memory, at least one page
	)
	// (func (loop (br 0)))
	in := header + types + funcs + memory + "\x0a\x09\x01\x07\x00\x03\x40\x0c\x00\x0b\x0b"
	check := "" +
		"\x23\x01\x45\x04\x40" + // global.get slice; i32.eqz; if
		"\x41\x00\x40\x00\x1a" + //   i32.const 0; memory.grow 0; drop
		"\x23\x00\x04\x40\x00\x0b" + //   global.get flag; if; unreachable; end
		"\x23\x02\x50\x04\x40\x00\x0b" + //   global.get fuel; i64.eqz; if; unreachable; end
		"\x23\x02\x42\x80\x08" + //   global.get fuel; i64.const 1024
		"\x23\x02\x42\x80\x08\x54" + //   global.get fuel; i64.const 1024; i64.lt_u
		"\x1b\xa7\x24\x01" + //   select; i32.wrap_i64; global.set slice
		"\x23\x02\x23\x01\xad\x7d\x24\x02" + //   global.get fuel; global.get slice; i64.extend_i32_u; i64.sub; global.set fuel
		"\x0b" + // end
		"\x23\x01\x41\x01\x6b\x24\x01" // global.get slice; i32.const 1; i32.sub; global.set slice
	globals := "\x06\x19\x03" + // global section, 25 bytes: three entries
		"\x7f\x01\x41\x00\x0b" + // flag: mut i32 = 0
		"\x7f\x01\x41\x00\x0b" + // slice: mut i32 = 0
		"\x7e\x01\x42\xff\xff\xff\xff\xff\xff\xff\xff\xff\x00\x0b" // fuel: mut i64 = MaxInt64
	exports := "\x07\x3c\x03" + // export section, 60 bytes: three entries
		"\x12" + FlagExport + "\x03\x00" + // global 0
		"\x13" + SliceExport + "\x03\x01" + // global 1
		"\x0d" + FuelExport + "\x03\x02" // global 2
	body := "\x00" + check + "\x03\x40" + check + "\x0c\x00\x0b\x0b"
	code := "\x0a" + string([]byte{byte(len(body) + 2), 1, byte(len(body))}) + body // one body
	want := header + types + funcs + memory + globals + exports + code
	got, err := Instrument([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte(want)) {
		t.Errorf("Instrument =\n%x\nwant\n%x", got, want)
	}
}

func TestSLEB(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		v    int64
		want []byte
	}{
		{0, []byte{0x00}},
		{1, []byte{0x01}},
		{63, []byte{0x3f}},
		{64, []byte{0xc0, 0x00}},
		{1024, []byte{0x80, 0x08}},
		{-1, []byte{0x7f}},
		{-64, []byte{0x40}},
		{-65, []byte{0xbf, 0x7f}},
		{math.MaxInt64, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00}},
	} {
		if got := sleb(tc.v); !bytes.Equal(got, tc.want) {
			t.Errorf("sleb(%d) = %x, want %x", tc.v, got, tc.want)
		}
	}
}

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
			out, err := Instrument(code)
			if e.Name() == "startloop.wasm" {
				if !errors.Is(err, ErrUninstrumentable) {
					t.Fatalf("instrument a module with a start section = %v, want ErrUninstrumentable", err)
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
			if g, ok := mod.ExportedGlobal(FlagExport).(api.MutableGlobal); !ok || g.Type() != api.ValueTypeI32 {
				t.Fatalf("instrumented module does not export a mutable i32 %s", FlagExport)
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
	out, err := Instrument(code)
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
	g := mod.ExportedGlobal(FlagExport).(api.MutableGlobal)
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

// instantiate instruments the built test module name and instantiates it.
func instantiate(t *testing.T, name string) api.Module {
	t.Helper()
	ctx := context.Background()
	code, err := os.ReadFile(policytest.Build(t).Path(t, name))
	if err != nil {
		t.Fatal(err)
	}
	out, err := Instrument(code)
	if err != nil {
		t.Fatal(err)
	}
	rt := wazero.NewRuntime(ctx)
	t.Cleanup(func() { rt.Close(ctx) })
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	mod, err := rt.Instantiate(ctx, out)
	if err != nil {
		t.Fatal(err)
	}
	return mod
}

// TestFuelCountsExactly runs the count module, which does n + 2 units of
// work, with fuel for exactly that much and for one unit less, around slice
// boundaries: the first call ends with no fuel left, the second traps.
func TestFuelCountsExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mod := instantiate(t, "count")
	fuel := mod.ExportedGlobal(FuelExport).(api.MutableGlobal)
	slice := mod.ExportedGlobal(SliceExport).(api.MutableGlobal)
	if fuel.Get() != math.MaxInt64 || slice.Get() != 0 {
		t.Fatalf("fresh instance: fuel %d, slice %d, want no limit and 0", fuel.Get(), slice.Get())
	}
	fn := mod.ExportedFunction("codemode_request")
	run := func(n, budget uint64) (left uint64, err error) {
		fuel.Set(budget)
		slice.Set(0)
		_, err = fn.Call(ctx, n)
		return fuel.Get() + uint64(uint32(slice.Get())), err
	}
	for _, n := range []uint64{0, 1, SliceUnits - 3, SliceUnits - 2, SliceUnits - 1, SliceUnits, 5 * SliceUnits, 100_000} {
		work := n + 2
		if left, err := run(n, work); err != nil || left != 0 {
			t.Errorf("n=%d with fuel %d: left %d, err %v; want 0 left, no error", n, work, left, err)
		}
		if left, err := run(n, work+10); err != nil || left != 10 {
			t.Errorf("n=%d with fuel %d: left %d, err %v; want 10 left, no error", n, work+10, left, err)
		}
		if _, err := run(n, work-1); err == nil || !strings.Contains(err.Error(), "unreachable") {
			t.Errorf("n=%d with fuel %d: err %v, want an unreachable trap", n, work-1, err)
		}
	}
	// A module the host never gives fuel runs unbounded, as before.
	fuel.Set(math.MaxInt64)
	slice.Set(0)
	if _, err := fn.Call(ctx, 1_000_000); err != nil {
		t.Fatalf("call with no limit: %v", err)
	}
}

// TestFuelStopsLoop runs the endless loop with a million units of fuel: it
// traps having used them all, with no flag set.
func TestFuelStopsLoop(t *testing.T) {
	t.Parallel()
	mod := instantiate(t, "loop")
	fuel := mod.ExportedGlobal(FuelExport).(api.MutableGlobal)
	slice := mod.ExportedGlobal(SliceExport).(api.MutableGlobal)
	fuel.Set(1_000_000)
	slice.Set(0)
	start := time.Now()
	_, err := mod.ExportedFunction("codemode_request").Call(context.Background(), 0)
	if err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Fatalf("call = %v, want an unreachable trap", err)
	}
	if fuel.Get() != 0 || slice.Get() != 0 {
		t.Fatalf("after the trap: fuel %d, slice %d, want both 0", fuel.Get(), slice.Get())
	}
	t.Logf("a million units of an empty loop took %v", time.Since(start))
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
		{"exports the fuel name", []byte("\x00asm\x01\x00\x00\x00\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x05\x03\x01\x00\x01\x07\x11\x01\x0dcodemode_fuel\x00\x00\x0a\x04\x01\x02\x00\x0b"), "already exports codemode_fuel"},
		{"no memory", []byte("\x00asm\x01\x00\x00\x00\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x0a\x04\x01\x02\x00\x0b"), "no memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Instrument(tc.b); !errors.Is(err, ErrUninstrumentable) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("instrument = %v, want ErrUninstrumentable about %q", err, tc.want)
			}
		})
	}
}

// FuzzInstrument checks that no input makes the rewriter panic.
func FuzzInstrument(f *testing.F) {
	f.Add([]byte("\x00asm\x01\x00\x00\x00"))
	f.Add([]byte("\x00asm\x01\x00\x00\x00\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x0a\x09\x01\x07\x00\x03\x40\x0c\x00\x0b\x0b"))
	f.Fuzz(func(t *testing.T, b []byte) { _, _ = Instrument(b) })
}
