// Package wasminterrupt rewrites a WebAssembly module so that its host can
// bound a call by the work it does and interrupt it cheaply: the guest
// counts down a fuel global at every loop iteration and function entry and
// traps when it runs out, and traps at once when the host sets an exported
// flag global (at a wall-clock backstop, or when the caller goes away). It
// is Wasmtime's fuel and epoch interruption done in the module, for wazero,
// whose own mechanism (WithCloseOnContextDone) costs about 35 ns per loop
// iteration and counts wall-clock time only; see ../RATIONALE.md for the
// measurements.
//
// [Instrument] is a pure function over bytes: it neither compiles nor runs
// the module, and is safe for concurrent use.
package wasminterrupt

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Names of the globals that [Instrument] adds and exports.
const (
	// FlagExport names a mutable i32. Setting it to a non-zero value makes
	// every call into the instance trap with "unreachable" within
	// [SliceUnits] units of work.
	FlagExport = "codemode_interrupt"
	// FuelExport names a mutable i64: the fuel left, not counting the
	// current slice. A call traps with "unreachable" when it needs a unit
	// of work and both this and the slice are zero. It starts at
	// math.MaxInt64 (no limit).
	FuelExport = "codemode_fuel"
	// SliceExport names a mutable i32: the units of the current slice
	// (taken from the fuel) not yet used. A host that sets the fuel before a
	// call sets this to 0, so that the call gets exactly the fuel set; the
	// units the call used are then the fuel set minus what is left in
	// both.
	SliceExport = "codemode_fuel_slice"
)

// ErrUninstrumentable is the error (wrapped with the reason) of a module
// that [Instrument] does not know how to rewrite or cannot bound. The
// caller then interrupts it some other way.
var ErrUninstrumentable = errors.New("cannot instrument module")

// SliceUnits is the most units of work a slice holds: the guest leaves
// native code for Go, checks the flag and takes the next slice from the
// fuel once per slice.
const SliceUnits = 1024

// Instrument returns a copy of the WebAssembly module wasm rewritten so that
// the host can bound and interrupt its calls. It adds three mutable
// globals, exported as [FlagExport], [FuelExport] and [SliceExport]. One
// unit of work is one loop iteration or one function call: at the head of
// every loop and at the entry of every function it inserts
//
//	if slice == 0 {                      // once per SliceUnits units
//		drop(memory.grow(0))             // leave native code
//		if flag != 0 { unreachable }     // interrupted by the host
//		if fuel == 0 { unreachable }     // out of fuel
//		slice = min(fuel, SliceUnits)
//		fuel -= slice
//	}
//	slice--
//
// so that a call with fuel N set (and slice 0) runs exactly N units and
// traps at the next one. The fast path is a load, a compare and branch, and
// a decrement; a function that neither loops nor calls ends by itself.
//
// The memory.grow(0) once per slice matters: Go cannot preempt a goroutine
// while it runs native code, so a guest spinning in pure native code would
// hold off a stop-the-world garbage collection, and with it the timer that
// is to set the flag: the process would hang (seen in testing). memory.grow
// is compiled as a call into Go, where the goroutine can be stopped.
// wazero's own WithCloseOnContextDone makes that call at every iteration
// (35 ns each here) and starts a goroutine per call.
//
// DWARF sections are dropped: their code offsets would no longer be right.
//
// # Errors
//
// It returns an error wrapping [ErrUninstrumentable] for what it does not
// know or cannot bound: SIMD, exceptions, tail calls (which loop without a
// loop), a start section (which runs before the host holds the flag),
// several memories, a module without memory, a module that already exports
// one of the names above, or code that names globals it does not define
// (after the rewrite they would reach the added ones, and a module that
// refills its own fuel cannot be stopped). Malformed input is refused the
// same way.
func Instrument(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 || string(wasm[:4]) != magic || string(wasm[4:8]) != version {
		return nil, fmt.Errorf("%w: not a WebAssembly 1.0 binary", ErrUninstrumentable)
	}
	sections, err := readSections(wasm[8:])
	if err != nil {
		return nil, err
	}
	l, err := survey(sections)
	if err != nil {
		return nil, err
	}
	return rewrite(wasm[:8], sections, l, newAdditions(l.globals))
}

// section is one section of a module: its id and its body.
type section struct {
	id   byte
	body []byte
}

// readSections splits a module's sections, after its magic and version.
func readSections(b []byte) ([]section, error) {
	var sections []section
	r := reader{b: b}
	for !r.done() {
		id := r.byte()
		size := r.u32()
		body := r.take(int(size))
		if r.err != nil {
			return nil, r.err
		}
		sections = append(sections, section{id, body})
	}
	return sections, nil
}

// layout is what the rewrite needs to know of a module's sections.
type layout struct {
	// globals counts the module's globals, imported and defined: the
	// index of the first added one.
	globals uint32
	// hasGlobal and hasExport say whether the module has a global and an
	// export section, which the added entries then join.
	hasGlobal, hasExport bool
}

// survey reads a module's layout, and refuses a module that has a start
// section, lacks code or memory, or already exports an added name.
func survey(sections []section) (layout, error) {
	var l layout
	var importedGlobals, definedGlobals uint32
	hasCode, hasMemory := false, false
	for _, s := range sections {
		switch s.id {
		case sectionImport:
			n, mem, err := countImports(s.body)
			if err != nil {
				return layout{}, err
			}
			importedGlobals, hasMemory = n, hasMemory || mem
		case sectionMemory:
			sr := reader{b: s.body}
			hasMemory = hasMemory || sr.u32() > 0
		case sectionGlobal:
			l.hasGlobal = true
			sr := reader{b: s.body}
			definedGlobals = sr.u32()
			if sr.err != nil {
				return layout{}, sr.err
			}
		case sectionExport:
			l.hasExport = true
		case sectionStart:
			// The start function runs inside instantiation, before the host
			// holds the flag: leave such modules to wazero's mechanism.
			return layout{}, fmt.Errorf("%w: start section", ErrUninstrumentable)
		case sectionCode:
			hasCode = true
		}
	}
	l.globals = importedGlobals + definedGlobals
	for _, s := range sections {
		if s.id == sectionExport {
			if err := checkExports(s.body, l.globals); err != nil {
				return layout{}, err
			}
		}
	}
	if !hasCode || !hasMemory {
		return layout{}, fmt.Errorf("%w: no code or no memory", ErrUninstrumentable)
	}
	return l, nil
}

// additions are what the rewrite adds to a module: three globals' entries
// (flag, slice, fuel), their three exports' entries, and the check it
// inserts into the code.
type additions struct {
	globals, exports, check []byte
}

// newAdditions returns the additions to a module of globals globals.
func newAdditions(globals uint32) additions {
	flag := uleb(uint64(globals))
	slice := uleb(uint64(globals + 1))
	fuel := uleb(uint64(globals + 2))
	var add additions
	add.check = fuelCheck(flag, slice, fuel)
	add.globals = append(add.globals, newGlobal(typeI32, 0)...)             // flag
	add.globals = append(add.globals, newGlobal(typeI32, 0)...)             // slice
	add.globals = append(add.globals, newGlobal(typeI64, math.MaxInt64)...) // fuel
	for _, e := range []struct {
		name  string
		index []byte
	}{{FlagExport, flag}, {SliceExport, slice}, {FuelExport, fuel}} {
		add.exports = append(add.exports, uleb(uint64(len(e.name)))...)
		add.exports = append(append(append(add.exports, e.name...), externGlobal), e.index...)
	}
	return add
}

// rewrite writes the module of header and sections with add: the globals
// and exports joined to the module's sections of those (or in sections of
// their own), the check in the code, and DWARF dropped.
func rewrite(header []byte, sections []section, l layout, add additions) ([]byte, error) {
	out := append([]byte(nil), header...)
	emit := func(id byte, body []byte) {
		out = append(out, id)
		out = append(out, uleb(uint64(len(body)))...)
		out = append(out, body...)
	}
	// Sections must keep their order: global and export come after memory
	// and before start, element, data count, code and data.
	hasGlobal, hasExport := l.hasGlobal, l.hasExport
	placeGlobal := func() {
		if !hasGlobal {
			emit(sectionGlobal, append(uleb(3), add.globals...))
			hasGlobal = true
		}
	}
	placeExport := func() {
		if !hasExport {
			emit(sectionExport, append(uleb(3), add.exports...))
			hasExport = true
		}
	}
	for _, s := range sections {
		switch s.id {
		case sectionCustom:
			if isDWARF(s.body) {
				continue
			}
		case sectionGlobal:
			body, err := appendEntries(s.body, 3, add.globals)
			if err != nil {
				return nil, err
			}
			emit(sectionGlobal, body)
			continue
		case sectionExport:
			placeGlobal()
			body, err := appendEntries(s.body, 3, add.exports)
			if err != nil {
				return nil, err
			}
			emit(sectionExport, body)
			continue
		case sectionStart, sectionElement, sectionCode, sectionData, sectionDataCount:
			placeGlobal()
			placeExport()
			if s.id == sectionCode {
				body, err := instrumentCode(s.body, add.check, l.globals)
				if err != nil {
					return nil, err
				}
				emit(sectionCode, body)
				continue
			}
		}
		emit(s.id, s.body)
	}
	return out, nil
}

// fuelCheck returns the code inserted at the head of every loop and the
// entry of every function, given the encoded indexes of the flag, slice
// and fuel globals.
func fuelCheck(flag, slice, fuel []byte) []byte {
	var c []byte
	op := func(code byte, imm ...byte) { c = append(append(c, code), imm...) }
	// if slice == 0 {
	op(opGlobalGet, slice...)
	op(opI32Eqz)
	op(opIf, blockEmpty)
	//   drop(memory.grow(0))
	op(opI32Const, sleb(0)...)
	op(opMemoryGrow, 0x00) // memory index 0
	op(opDrop)
	//   if flag { unreachable }
	op(opGlobalGet, flag...)
	op(opIf, blockEmpty)
	op(opUnreachable)
	op(opEnd)
	//   if fuel == 0 { unreachable }
	op(opGlobalGet, fuel...)
	op(opI64Eqz)
	op(opIf, blockEmpty)
	op(opUnreachable)
	op(opEnd)
	//   slice = i32(fuel <u SliceUnits ? fuel : SliceUnits)
	op(opGlobalGet, fuel...)
	op(opI64Const, sleb(SliceUnits)...)
	op(opGlobalGet, fuel...)
	op(opI64Const, sleb(SliceUnits)...)
	op(opI64LtU)
	op(opSelect)
	op(opI32WrapI64)
	op(opGlobalSet, slice...)
	//   fuel -= slice
	op(opGlobalGet, fuel...)
	op(opGlobalGet, slice...)
	op(opI64ExtendI32U)
	op(opI64Sub)
	op(opGlobalSet, fuel...)
	// }
	op(opEnd)
	// slice--
	op(opGlobalGet, slice...)
	op(opI32Const, sleb(1)...)
	op(opI32Sub)
	op(opGlobalSet, slice...)
	return c
}

// newGlobal encodes a global entry: a mutable i32 or i64 that starts at v.
func newGlobal(typ byte, v int64) []byte {
	g := []byte{typ, globalVar, opI32Const}
	if typ == typeI64 {
		g[2] = opI64Const
	}
	g = append(g, sleb(v)...)
	return append(g, opEnd)
}

// sleb encodes v as signed LEB128, the immediate of i32.const and i64.const.
func sleb(v int64) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 && c&0x40 == 0 || v == -1 && c&0x40 != 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func isDWARF(custom []byte) bool {
	r := reader{b: custom}
	name := r.take(int(r.u32()))
	return r.err == nil && strings.HasPrefix(string(name), ".debug_")
}

// appendEntries adds n encoded entries to a section that is a vector.
func appendEntries(body []byte, n uint64, entry []byte) ([]byte, error) {
	r := reader{b: body}
	count := r.u32()
	if r.err != nil {
		return nil, r.err
	}
	out := uleb(uint64(count) + n)
	out = append(out, r.b...)
	return append(out, entry...), nil
}

// countImports returns the number of imported globals and whether a memory
// is imported.
func countImports(body []byte) (globals uint32, memory bool, err error) {
	r := reader{b: body}
	for n := r.u32(); n > 0 && r.err == nil; n-- {
		r.take(int(r.u32())) // module
		r.take(int(r.u32())) // name
		switch kind := r.byte(); kind {
		case externFunc:
			r.u32() // type index
		case externTable:
			r.byte() // reference type
			r.limits()
		case externMemory:
			r.limits()
			memory = true
		case externGlobal:
			r.byte() // value type
			r.byte() // mutability
			globals++
		default:
			return 0, false, fmt.Errorf("%w: import kind %#x", ErrUninstrumentable, kind)
		}
	}
	return globals, memory, r.err
}

// checkExports refuses a module that already exports one of the added
// globals' names or exports a global index it does not have (which would be
// an added one).
func checkExports(body []byte, globals uint32) error {
	r := reader{b: body}
	for n := r.u32(); n > 0 && r.err == nil; n-- {
		name := r.take(int(r.u32()))
		kind := r.byte()
		idx := r.u32()
		switch string(name) {
		case FlagExport, FuelExport, SliceExport:
			return fmt.Errorf("%w: module already exports %s", ErrUninstrumentable, name)
		}
		if kind == externGlobal && idx >= globals {
			return fmt.Errorf("%w: export of global index out of range", ErrUninstrumentable)
		}
	}
	return r.err
}

// instrumentCode inserts check at the entry of every function and after the
// block type of every loop. Code
// must only use the module's own globals (fewer than globals): an index that
// was invalid before the rewrite would reach the added ones, and a module
// that clears its interrupt flag cannot be stopped.
func instrumentCode(body, check []byte, globals uint32) ([]byte, error) {
	r := reader{b: body}
	n := r.u32()
	out := uleb(uint64(n))
	for ; n > 0 && r.err == nil; n-- {
		fn := r.take(int(r.u32()))
		if r.err != nil {
			break
		}
		nf, err := instrumentFunction(fn, check, globals)
		if err != nil {
			return nil, err
		}
		out = append(out, uleb(uint64(len(nf)))...)
		out = append(out, nf...)
	}
	if r.err == nil && !r.done() {
		return nil, fmt.Errorf("%w: trailing bytes in code section", ErrUninstrumentable)
	}
	return out, r.err
}

// instrumentFunction copies one function body, inserting check after its
// locals and after every loop's block type. It decodes every instruction it
// passes, so that an immediate byte is never taken for an opcode.
func instrumentFunction(fn, check []byte, globals uint32) ([]byte, error) {
	r := reader{b: fn}
	for n := r.u32(); n > 0 && r.err == nil; n-- { // locals: count and type
		r.u32()
		r.byte()
	}
	out := make([]byte, 0, len(fn)+64)
	out = append(out, fn[:len(fn)-len(r.b)]...)
	out = append(out, check...)
	for !r.done() && r.err == nil {
		start := len(fn) - len(r.b)
		op := r.byte()
		if err := skipImmediates(&r, op, globals); err != nil {
			return nil, err
		}
		out = append(out, fn[start:len(fn)-len(r.b)]...)
		if op == opLoop {
			out = append(out, check...)
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	return out, nil
}

// skipImmediates reads past the immediates of the instruction op, checking
// the global and memory indexes it names: globals must be the module's own
// (fewer than globals), and memory the first. An opcode it does not know
// is refused.
func skipImmediates(r *reader, op byte, globals uint32) error {
	switch {
	case op == opBlock || op == opIf || op == opLoop:
		r.blockType()
	case op == opGlobalGet || op == opGlobalSet:
		if r.u32() >= globals {
			return fmt.Errorf("%w: global index out of range", ErrUninstrumentable)
		}
	case op == opBr || op == opBrIf || op == opCall ||
		op >= opLocalGet && op <= opTableSet || op == opRefFunc:
		r.u32() // label, function, local or table index
	case op == opBrTable:
		for k := r.u32(); k > 0 && r.err == nil; k-- {
			r.u32()
		}
		r.u32()
	case op == opCallIndirect:
		r.u32() // type index
		r.u32() // table index
	case op == opSelectTyped:
		for k := r.u32(); k > 0 && r.err == nil; k-- {
			r.byte()
		}
	case op >= opI32Load && op <= opI64Store32: // memarg
		if align := r.u32(); align&memargMultiMemory != 0 {
			return fmt.Errorf("%w: multiple memories", ErrUninstrumentable)
		}
		r.u64() // offset
	case op == opMemorySize || op == opMemoryGrow:
		if r.byte() != 0 {
			return fmt.Errorf("%w: multiple memories", ErrUninstrumentable)
		}
	case op == opI32Const || op == opI64Const:
		r.u64()
	case op == opF32Const:
		r.take(4)
	case op == opF64Const:
		r.take(8)
	case op == opRefNull:
		r.byte() // reference type
	case op == opUnreachable || op == opNop || op == opElse || op == opEnd || op == opReturn ||
		op == opDrop || op == opSelect || op >= opI32Eqz && op <= opI64Extend32S || op == opRefIsNull:
		// no immediates
	case op == opPrefixFC:
		return skipPrefixFC(r)
	default:
		return fmt.Errorf("%w: opcode %#x", ErrUninstrumentable, op)
	}
	return nil
}

// skipPrefixFC reads past an instruction of prefix 0xfc (saturating
// truncations, bulk memory and table operations): its sub-opcode and
// immediates.
func skipPrefixFC(r *reader) error {
	switch sub := r.u32(); {
	case sub <= fcI64TruncSatF64U:
	case sub == fcMemoryInit:
		r.u32() // data index
		r.byte()
	case sub == fcDataDrop || sub == fcElemDrop || sub >= fcTableGrow && sub <= fcTableFill:
		r.u32() // data, element or table index
	case sub == fcMemoryCopy:
		r.byte()
		r.byte()
	case sub == fcMemoryFill:
		r.byte()
	case sub == fcTableInit || sub == fcTableCopy:
		r.u32()
		r.u32()
	default:
		return fmt.Errorf("%w: opcode 0xfc %d", ErrUninstrumentable, sub)
	}
	return nil
}
