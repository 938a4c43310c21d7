package policy

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/codemode-go/codemode/edge/internal/policy/wasminterrupt"
	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"
)

// ABI v1 export names; see policies/ABI.md.
const (
	abiVersion       = 1
	exportVersion    = "codemode_abi_version"
	exportBuffer     = "codemode_buffer"
	exportInit       = "codemode_init"
	exportRequest    = "codemode_request"
	exportResult     = "codemode_result"
	exportMemory     = "memory"
	maxDecisionBytes = 16 << 20
	// initDeadline bounds instantiation (a start section, which only a
	// module that is not instrumented may have) and the initialisation of
	// a module that has no fuel. An instrumented module's initialisation
	// is bounded by its fuel, as a call is, with initBackstop behind it:
	// off the request path on a loaded host, 2 s was passed.
	initDeadline = 2 * time.Second
	initBackstop = 30 * time.Second
)

// Errors of a policy call. Each makes the call count as failed.
var (
	errTimeout      = errors.New("policy call passed its deadline")
	errFuel         = errors.New("fuel exhausted")
	errTrap         = errors.New("policy trapped")
	errMalformed    = errors.New("malformed decision")
	errUnavailable  = errors.New("no policy instance available")
	errInputTooBig  = errors.New("input too large for policy")
	errInvalid      = errors.New("invalid decision")
	errModuleClosed = errors.New("policy module closed")
)

// counters count one module's outcomes; see policyv1.PolicyCounters.
type counters struct {
	allowed, denied, traps, timeouts, fuelExhausted, invalid, failedOpen, replaced, unavailable atomic.Uint64
}

// module is one loaded policy: its runtime, its compiled code and its pool.
// The runtime is its own so that its memory cap is its own.
type module struct {
	cfg    PolicyConfig
	sha256 string
	logger *slog.Logger

	rt        wazero.Runtime
	compiled  wazero.CompiledModule
	interrupt bool // instrumented: calls count fuel, deadlines set the interrupt global
	config    []byte
	evaluate  string // export called per evaluation

	pool *pool // nil until loaded
	// counters are shared with the same policy (name, phase and digest) in
	// the generations before and after this one, so a reload does not reset
	// them.
	counters *counters
	// metrics are the policy's Prometheus series; nil: none.
	metrics *moduleMetrics
}

// instance is one instantiated module, used by one call at a time.
type instance struct {
	mod      api.Module
	mem      api.Memory
	buffer   api.Function
	evaluate api.Function
	bufPtr   uint32
	bufCap   uint32
	stack    [1]uint64
	stderr   *capWriter
	deadline *deadlineCtx
	fuel     fuelGauge // zero: not instrumented
}

// loadModule reads, checks, compiles and warms one policy.
func loadModule(ctx context.Context, cfg PolicyConfig, dir string, cache wazero.CompilationCache, logger *slog.Logger, contextInterrupt bool) (_ *module, err error) {
	path := cfg.resolve(dir)
	code, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read module: %w", err)
	}
	sum := sha256.Sum256(code)
	digest := hex.EncodeToString(sum[:])
	if digest != cfg.SHA256 {
		return nil, fmt.Errorf("module digest mismatch: file has sha256 %s, config pins %s", digest, cfg.SHA256)
	}
	m := &module{
		cfg:      cfg,
		sha256:   digest,
		logger:   logger.With("policy", cfg.Name),
		config:   cfg.configBytes(),
		counters: new(counters),
	}
	m.evaluate = exportRequest
	if cfg.Phase == PhaseResult {
		m.evaluate = exportResult
	}
	defer func() {
		if err != nil && m.rt != nil {
			m.close(context.WithoutCancel(ctx))
		}
	}()
	// Count fuel and interrupt by the instrumented check where the module
	// allows it, else stop calls at their deadline only, by wazero's
	// WithCloseOnContextDone (see package wasminterrupt and RATIONALE.md).
	if !contextInterrupt {
		instrumented, ierr := wasminterrupt.Instrument(code)
		if ierr == nil {
			if err := m.compile(ctx, instrumented, cache, false); err == nil {
				m.interrupt = true
			} else {
				m.logger.Warn("instrumented policy does not compile; using context interruption, with no fuel limit", "error", err)
				m.rt.Close(ctx)
			}
		} else {
			m.logger.Warn("policy cannot be instrumented; using context interruption, with no fuel limit: only its deadline bounds a call", "reason", ierr, "deadline", time.Duration(cfg.Deadline))
		}
	}
	if !m.interrupt {
		if err := m.compile(ctx, code, cache, true); err != nil {
			return nil, err
		}
	}
	if err := m.checkExports(); err != nil {
		return nil, err
	}
	if err := m.checkImports(); err != nil {
		return nil, err
	}
	size := cfg.PoolSize
	if size == 0 {
		size = min(runtime.GOMAXPROCS(0), 8)
	}
	if m.pool, err = newPool(ctx, size, m.instantiate, m.logger); err != nil {
		return nil, err
	}
	return m, nil
}

// interruptMode names how the module's calls are bounded: "instrumented"
// (fuel and the deadline) or "context" (the deadline only).
func (m *module) interruptMode() string {
	if m.interrupt {
		return "instrumented"
	}
	return "context"
}

// compile makes the module's runtime and compiles code in it. The runtime
// is the module's own so that its memory cap is its own.
func (m *module) compile(ctx context.Context, code []byte, cache wazero.CompilationCache, closeOnContextDone bool) error {
	rc := wazero.NewRuntimeConfigCompiler().
		WithCompilationCache(cache).
		WithCloseOnContextDone(closeOnContextDone).
		WithMemoryLimitPages(m.cfg.MemoryLimitPages)
	m.rt = wazero.NewRuntimeWithConfig(ctx, rc)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, m.rt); err != nil {
		return fmt.Errorf("instantiate wasi: %w", err)
	}
	compiled, err := m.rt.CompileModule(ctx, code)
	if err != nil {
		return m.compileError(code, err)
	}
	m.compiled = compiled
	return nil
}

// checkExports checks the exports' presence and signatures before any
// instance exists.
func (m *module) checkExports() error {
	fns := m.compiled.ExportedFunctions()
	want := []struct {
		name            string
		params, results []api.ValueType
		optional        bool
	}{
		{exportVersion, nil, []api.ValueType{api.ValueTypeI32}, false},
		{exportBuffer, []api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI32}, false},
		{exportInit, []api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI64}, true},
		{m.evaluate, []api.ValueType{api.ValueTypeI32}, []api.ValueType{api.ValueTypeI64}, false},
	}
	for _, w := range want {
		fn, ok := fns[w.name]
		if !ok {
			if w.optional {
				continue
			}
			return &ABIError{Section: ABIExports, Missing: w.name,
				Err: fmt.Errorf("module does not export %s (not an ABI v1 policy for phase %s)", w.name, m.cfg.Phase)}
		}
		if !sameTypes(fn.ParamTypes(), w.params) || !sameTypes(fn.ResultTypes(), w.results) {
			return abiError(ABIExports, "export %s has the wrong signature", w.name)
		}
	}
	if _, ok := m.compiled.ExportedMemories()[exportMemory]; !ok {
		return abiError(ABIExports, "module does not export its memory as %q", exportMemory)
	}
	if m.cfg.Config != "" || m.cfg.ConfigBase64 != "" {
		if _, ok := fns[exportInit]; !ok {
			return abiError(ABIExports, "config given but module does not export %s", exportInit)
		}
	}
	return nil
}

func sameTypes(a, b []api.ValueType) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// instantiate makes one instance: start functions, version check, init.
func (m *module) instantiate(ctx context.Context) (_ *instance, err error) {
	stderr := &capWriter{max: 4096}
	mc := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions(). // _initialize runs below, under the deadline
		WithStderr(stderr).
		WithSysWalltime().
		WithSysNanotime().
		WithRandSource(rand.Reader)
	// A start section runs here; only uninstrumented modules may have one,
	// and wazero stops those at this deadline.
	ictx, cancel := context.WithTimeout(ctx, initDeadline)
	mod, err := m.rt.InstantiateModule(ictx, m.compiled, mc)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("instantiate module: %w%s", err, stderr.suffix())
	}
	defer func() {
		if err != nil {
			_ = mod.Close(context.WithoutCancel(ctx))
		}
	}()
	inst := &instance{
		mod:      mod,
		mem:      mod.Memory(),
		buffer:   mod.ExportedFunction(exportBuffer),
		evaluate: mod.ExportedFunction(m.evaluate),
		stderr:   stderr,
	}
	if inst.mem == nil {
		return nil, errors.New("module has no memory")
	}
	var flag api.MutableGlobal
	if m.interrupt {
		var ok, okFuel, okSlice bool
		flag, ok = mod.ExportedGlobal(wasminterrupt.FlagExport).(api.MutableGlobal)
		inst.fuel.fuel, okFuel = mod.ExportedGlobal(wasminterrupt.FuelExport).(api.MutableGlobal)
		inst.fuel.slice, okSlice = mod.ExportedGlobal(wasminterrupt.SliceExport).(api.MutableGlobal)
		if !ok || !okFuel || !okSlice {
			return nil, errors.New("instrumented module lost its interrupt or fuel globals")
		}
	}
	// Initialisation gets the fuel of a call whose input is the
	// configuration.
	fuel, deadline := m.cfg.fuel(len(m.config)), initDeadline
	if m.interrupt {
		inst.fuel.set(fuel)
		deadline = initBackstop
	}
	inst.deadline = newDeadlineCtx(flag)
	dctx := inst.deadline.start(ctx, deadline)
	err = m.initialize(dctx, inst)
	if !dctx.stop() {
		return nil, fmt.Errorf("initialise policy instance: passed its %v deadline", deadline)
	}
	if err != nil && inst.fuel.exhausted() {
		return nil, fmt.Errorf("initialise policy instance: %w: the module did more than %d units of work", errFuel, fuel)
	}
	return inst, err
}

// initialize runs the module's start function, checks its ABI version and
// hands it the configuration.
func (m *module) initialize(ctx context.Context, inst *instance) error {
	mod := inst.mod
	if start := mod.ExportedFunction("_initialize"); start != nil {
		if err := start.CallWithStack(ctx, inst.stack[:]); err != nil {
			return fmt.Errorf("call _initialize: %w%s", err, inst.stderr.suffix())
		}
	}
	if err := mod.ExportedFunction(exportVersion).CallWithStack(ctx, inst.stack[:]); err != nil {
		return fmt.Errorf("call %s: %w", exportVersion, err)
	}
	if v := uint32(inst.stack[0]); v != abiVersion {
		return abiError(ABIExports, "module implements policy ABI version %d, host implements %d", v, abiVersion)
	}
	if initFn := mod.ExportedFunction(exportInit); initFn != nil {
		if err := inst.write(ctx, m.config); err != nil {
			return fmt.Errorf("write config: %w", err)
		}
		inst.stack[0] = uint64(len(m.config))
		if err := initFn.CallWithStack(ctx, inst.stack[:]); err != nil {
			return fmt.Errorf("call %s: %w%s", exportInit, err, inst.stderr.suffix())
		}
		if msg, err := inst.read(inst.stack[0]); err != nil {
			return fmt.Errorf("read init answer: %w", err)
		} else if len(msg) > 0 {
			return fmt.Errorf("policy init: %s", truncate(string(msg), 512))
		}
	}
	return nil
}

// write copies b into the guest's input buffer, asking for a bigger one
// when needed.
func (inst *instance) write(ctx context.Context, b []byte) error {
	if uint32(len(b)) > inst.bufCap || inst.bufCap == 0 {
		inst.stack[0] = uint64(len(b))
		if err := inst.buffer.CallWithStack(ctx, inst.stack[:]); err != nil {
			return fmt.Errorf("call %s: %w", exportBuffer, err)
		}
		inst.bufPtr, inst.bufCap = uint32(inst.stack[0]), uint32(len(b))
		if uint64(inst.bufPtr)+uint64(inst.bufCap) > uint64(inst.mem.Size()) {
			return fmt.Errorf("%s returned a buffer outside memory", exportBuffer)
		}
	}
	if !inst.mem.Write(inst.bufPtr, b) {
		return errors.New("input buffer outside memory")
	}
	return nil
}

// read returns a view of the guest's answer at the packed address.
func (inst *instance) read(packed uint64) ([]byte, error) {
	ptr, n := uint32(packed>>32), uint32(packed)
	if n == 0 {
		return nil, nil
	}
	if n > maxDecisionBytes {
		return nil, fmt.Errorf("%w: %d bytes", errMalformed, n)
	}
	b, ok := inst.mem.Read(ptr, n)
	if !ok {
		return nil, fmt.Errorf("%w: answer outside memory", errMalformed)
	}
	return b, nil
}

// call runs one evaluation on a pooled instance and hands the answer's bytes
// to decode, which must not keep them. Any error discards the instance.
func (m *module) call(ctx context.Context, input []byte, decode func([]byte) error) error {
	_, err := m.callFuel(ctx, input, decode)
	return err
}

// callFuel is call, reporting the fuel the call used too (0 for a module
// without fuel).
func (m *module) callFuel(ctx context.Context, input []byte, decode func([]byte) error) (used uint64, err error) {
	if len(input) > m.cfg.MaxInputBytes {
		m.counters.unavailable.Add(1)
		return 0, fmt.Errorf("%w: %d bytes, limit %d", errInputTooBig, len(input), m.cfg.MaxInputBytes)
	}
	// Wait at most the call's deadline for an instance to come back or be
	// replaced, and a little more.
	inst, err := m.pool.get(ctx, time.Duration(m.cfg.Deadline)+250*time.Millisecond)
	if err != nil {
		if errors.Is(err, errUnavailable) {
			m.counters.unavailable.Add(1)
		}
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		m.pool.put(inst)
		return 0, err
	}
	fuel := m.cfg.fuel(len(input))
	inst.fuel.set(fuel)
	cctx := inst.deadline.start(ctx, time.Duration(m.cfg.Deadline))
	stopCancel := noStop
	if ctx.Done() != nil {
		// Cancelling the request interrupts the call as its deadline
		// would.
		stopCancel = context.AfterFunc(ctx, inst.deadline.fire)
	}
	err = m.run(cctx, inst, input, decode)
	if m.interrupt {
		used = fuel - min(fuel, inst.fuel.left())
	}
	if err != nil && errors.Is(err, errTrap) && inst.fuel.exhausted() {
		err = fmt.Errorf("%w: the module did more than %d units of work", errFuel, fuel)
	}
	cancelled := !stopCancel()
	if fired := !cctx.stop(); (fired || cancelled) && err == nil {
		// The deadline or a cancel came as the call returned: its answer
		// stands, but the instance may have been interrupted under it.
		cause := errTimeout
		if cancelled {
			cause = context.Canceled
		}
		m.discard(inst, cause)
		return used, nil
	}
	if err != nil && cancelled {
		err = fmt.Errorf("%w: %w", context.Canceled, err)
	}
	if err != nil {
		if ctx.Err() == nil {
			m.classify(err)
		}
		m.discard(inst, err)
		return used, err
	}
	m.pool.put(inst)
	return used, nil
}

func (m *module) run(ctx context.Context, inst *instance, input []byte, decode func([]byte) error) error {
	if err := inst.write(ctx, input); err != nil {
		return callError(ctx, err, inst)
	}
	inst.stack[0] = uint64(len(input))
	if err := inst.evaluate.CallWithStack(ctx, inst.stack[:]); err != nil {
		return callError(ctx, err, inst)
	}
	b, err := inst.read(inst.stack[0])
	if err != nil {
		return err
	}
	if err := decode(b); err != nil {
		return fmt.Errorf("%w: %w", errMalformed, err)
	}
	return nil
}

// callError tells a timeout from a trap. (The caller tells a trap for want
// of fuel from others.)
func callError(ctx context.Context, err error, inst *instance) error {
	var exit *sys.ExitError
	if errors.As(err, &exit) && exit.ExitCode() == sys.ExitCodeDeadlineExceeded ||
		errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", errTimeout, err)
	}
	return fmt.Errorf("%w: %w%s", errTrap, err, inst.stderr.suffix())
}

func (m *module) classify(err error) {
	switch {
	case errors.Is(err, errTimeout):
		m.counters.timeouts.Add(1)
	case errors.Is(err, errFuel):
		m.counters.fuelExhausted.Add(1)
	case errors.Is(err, errMalformed):
		m.counters.invalid.Add(1)
	case errors.Is(err, errUnavailable):
		m.counters.unavailable.Add(1)
	default:
		m.counters.traps.Add(1)
	}
}

// discard closes a failed instance; the pool replaces it.
func (m *module) discard(inst *instance, cause error) {
	m.counters.replaced.Add(1)
	m.pool.discard(inst, cause)
}

// close closes the pool, if any, and the runtime. The caller makes sure no
// call is in flight.
func (m *module) close(ctx context.Context) {
	if m.pool != nil {
		m.pool.close(ctx)
	}
	if err := m.rt.Close(ctx); err != nil {
		m.logger.Warn("close policy runtime", "error", err)
	}
}

// capWriter keeps the first max bytes written to it: a guest's stderr, for
// the log when it traps.
type capWriter struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *capWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := w.max - len(w.b); room > 0 {
		w.b = append(w.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (w *capWriter) suffix() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.b) == 0 {
		return ""
	}
	return " (stderr: " + truncate(string(w.b), 512) + ")"
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
