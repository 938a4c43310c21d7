package policy

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
)

// Sections of policies/ABI.md that an [ABIError] points to.
const (
	ABIExports  = "exports"
	ABIImports  = "imports"
	ABIEnforced = "what-the-host-enforces"
)

// ABIError is a module that does not follow policies/ABI.md: what is wrong,
// and the section of ABI.md to read. The engine's load errors wrap it, so
// that the edge's log and `edge policy check` both say where to look.
type ABIError struct {
	// Section is the anchor of the section in ABI.md, e.g. "exports".
	Section string
	// Missing names the required export the module lacks, when that is
	// what is wrong.
	Missing string
	Err     error
}

func (e *ABIError) Error() string {
	return fmt.Sprintf("%v (see policies/ABI.md#%s)", e.Err, e.Section)
}

func (e *ABIError) Unwrap() error { return e.Err }

func abiError(section string, format string, args ...any) error {
	return &ABIError{Section: section, Err: fmt.Errorf(format, args...)}
}

// wasmMagic starts every WebAssembly binary module.
var wasmMagic = []byte("\x00asm")

// compileError says why code did not compile, pointing to ABI.md where the
// module asked for something the host does not allow.
func (m *module) compileError(code []byte, err error) error {
	switch {
	case !bytes.HasPrefix(code, wasmMagic):
		return abiError(ABIExports, "not a WebAssembly module: the file does not start with \\0asm (a policy is a binary .wasm module; build WebAssembly text with wat2wasm)")
	case strings.Contains(err.Error(), "over limit of"):
		return abiError(ABIEnforced, "module asks for more memory than the policy may have (memory_limit_pages %d): %w", m.cfg.MemoryLimitPages, err)
	}
	return fmt.Errorf("compile module: %w", err)
}

// checkImports refuses imports the host does not offer: anything but the
// functions of wasi_snapshot_preview1.
func (m *module) checkImports() error {
	wasi := m.rt.Module(wasiModule)
	offered := make(map[string]bool)
	if wasi != nil {
		for name := range wasi.ExportedFunctionDefinitions() {
			offered[name] = true
		}
	}
	for _, fn := range m.compiled.ImportedFunctions() {
		mod, name, _ := fn.Import()
		if mod != wasiModule || !offered[name] {
			return abiError(ABIImports, "module imports function %s.%s, which the host does not offer (only the functions of %s)", mod, name, wasiModule)
		}
	}
	for _, mem := range m.compiled.ImportedMemories() {
		mod, name, _ := mem.Import()
		return abiError(ABIImports, "module imports memory %s.%s; a policy exports its own memory", mod, name)
	}
	return nil
}

const wasiModule = "wasi_snapshot_preview1"

// CallReport is what one policy call did, given to [Options.OnCall].
type CallReport struct {
	// Policy and Phase of the call.
	Policy, Phase string
	// Decision the module answered, as the host decoded it; nil when the
	// call failed before one was decoded.
	Decision proto.Message
	// Fuel is the units of work the call used, of FuelBudget; both are 0
	// for a module the host could not instrument (it has no fuel).
	Fuel, FuelBudget uint64
	// Duration of the call, from taking an instance to checking the decision.
	Duration time.Duration
	// Err is why the call failed (trap, fuel, deadline, malformed or
	// invalid decision); nil when it answered a valid decision.
	Err error
}

// fuelBudget returns the fuel budget of a call with an input of n bytes, or 0
// for a module without fuel.
func (m *module) fuelBudget(n int) uint64 {
	if !m.interrupt {
		return 0
	}
	return m.cfg.fuel(n)
}
