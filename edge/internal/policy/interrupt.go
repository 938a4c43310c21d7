package policy

import (
	"errors"
	"fmt"
	"strings"
)

// instrument rewrites a WebAssembly module so that the host can interrupt it
// cheaply. It adds two mutable i32 globals: a flag, exported as
// interruptExport, and a fuel counter. At the head of every loop it inserts:
//
//	if fuel == 0 { memory.grow(0); fuel = safePointEvery }  // leave native code now and then
//	if flag != 0 { unreachable }                            // the deadline passed
//	fuel--
//
// A timer sets the flag when a call passes its deadline, and the next loop
// iteration traps. Code without loops ends by itself (recursion runs out of
// stack, and stack growth leaves native code too).
//
// The memory.grow(0) every safePointEvery iterations matters: Go cannot
// preempt a goroutine while it runs native code, so a guest spinning in pure
// native code would hold off a stop-the-world garbage collection, and with it
// the timer that is to set the flag: the process would hang (seen in
// testing). memory.grow is compiled as a call into Go, where the goroutine
// can be stopped. wazero's own WithCloseOnContextDone makes that call at every
// iteration (35 ns each here) and starts a goroutine per call; this costs a
// few loads and stores per iteration and a Go call per safePointEvery.
//
// It returns errUninstrumentable for what it does not know or cannot bound
// (SIMD, exceptions, tail calls, which loop without a loop, a start
// section, several memories, a module without memory, ...); the caller
// then falls back to WithCloseOnContextDone. DWARF sections are dropped:
// their code offsets would no longer be right.
func instrument(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" || string(wasm[4:8]) != "\x01\x00\x00\x00" {
		return nil, fmt.Errorf("%w: not a WebAssembly 1.0 binary", errUninstrumentable)
	}
	type section struct {
		id   byte
		body []byte
	}
	var sections []section
	r := wreader{b: wasm[8:]}
	for !r.done() {
		id := r.byte()
		size := r.u32()
		body := r.take(int(size))
		if r.err != nil {
			return nil, r.err
		}
		sections = append(sections, section{id, body})
	}
	var importedGlobals, definedGlobals uint32
	hasGlobal, hasExport, hasCode, hasMemory := false, false, false, false
	for _, s := range sections {
		switch s.id {
		case 2:
			n, mem, err := countImports(s.body)
			if err != nil {
				return nil, err
			}
			importedGlobals, hasMemory = n, hasMemory || mem
		case 5:
			sr := wreader{b: s.body}
			hasMemory = hasMemory || sr.u32() > 0
		case 6:
			hasGlobal = true
			sr := wreader{b: s.body}
			definedGlobals = sr.u32()
			if sr.err != nil {
				return nil, sr.err
			}
		case 7:
			hasExport = true
		case 8:
			// The start function runs inside instantiation, before the host
			// holds the flag: leave such modules to wazero's mechanism.
			return nil, fmt.Errorf("%w: start section", errUninstrumentable)
		case 10:
			hasCode = true
		}
	}
	for _, s := range sections {
		if s.id == 7 {
			if err := checkExports(s.body, importedGlobals+definedGlobals); err != nil {
				return nil, err
			}
		}
	}
	if !hasCode || !hasMemory {
		return nil, fmt.Errorf("%w: no code or no memory", errUninstrumentable)
	}
	flag := uleb(uint64(importedGlobals + definedGlobals))
	fuel := uleb(uint64(importedGlobals + definedGlobals + 1))
	every := uleb(safePointEvery)
	var check []byte
	check = append(append(append(check, 0x23), fuel...), 0x45, 0x04, 0x40)       // if fuel == 0 {
	check = append(check, 0x41, 0x00, 0x40, 0x00, 0x1A)                          //   drop(memory.grow(0))
	check = append(append(append(check, 0x41), every...), 0x24)                  //   fuel = safePointEvery
	check = append(append(check, fuel...), 0x0B)                                 // }
	check = append(append(append(check, 0x23), flag...), 0x04, 0x40, 0x00, 0x0B) // if flag { unreachable }
	check = append(append(append(check, 0x23), fuel...), 0x41, 0x01, 0x6B, 0x24) // fuel = fuel - 1
	check = append(check, fuel...)
	newGlobal := []byte{0x7F, 0x01, 0x41, 0x00, 0x0B}                               // flag: mut i32 = 0
	newGlobal = append(append(append(newGlobal, 0x7F, 0x01, 0x41), every...), 0x0B) // fuel: mut i32 = safePointEvery
	newExport := append(append(uleb(uint64(len(interruptExport))), interruptExport...), 0x03)
	newExport = append(newExport, flag...)

	out := append([]byte(nil), wasm[:8]...)
	emit := func(id byte, body []byte) {
		out = append(out, id)
		out = append(out, uleb(uint64(len(body)))...)
		out = append(out, body...)
	}
	// Sections must keep their order: global (6) and export (7) come after
	// memory (5) and before start (8), element (9), data count (12), code (10).
	placeGlobal := func() {
		if !hasGlobal {
			emit(6, append(uleb(2), newGlobal...))
			hasGlobal = true
		}
	}
	placeExport := func() {
		if !hasExport {
			emit(7, append(uleb(1), newExport...))
			hasExport = true
		}
	}
	for _, s := range sections {
		switch {
		case s.id == 0:
			if isDWARF(s.body) {
				continue
			}
		case s.id == 6:
			body, err := appendEntries(s.body, 2, newGlobal)
			if err != nil {
				return nil, err
			}
			emit(6, body)
			continue
		case s.id == 7:
			placeGlobal()
			body, err := appendEntries(s.body, 1, newExport)
			if err != nil {
				return nil, err
			}
			emit(7, body)
			continue
		case s.id == 8 || s.id == 9 || s.id == 10 || s.id == 11 || s.id == 12:
			placeGlobal()
			placeExport()
			if s.id == 10 {
				body, err := instrumentCode(s.body, check, importedGlobals+definedGlobals)
				if err != nil {
					return nil, err
				}
				emit(10, body)
				continue
			}
		}
		emit(s.id, s.body)
	}
	return out, nil
}

// interruptExport names the flag global that instrument adds.
const interruptExport = "codemode_interrupt"

// safePointEvery is how many loop iterations run between two calls into Go.
const safePointEvery = 1024

var errUninstrumentable = errors.New("cannot instrument module")

func isDWARF(custom []byte) bool {
	r := wreader{b: custom}
	name := r.take(int(r.u32()))
	return r.err == nil && strings.HasPrefix(string(name), ".debug_")
}

// appendEntries adds n encoded entries to a section that is a vector.
func appendEntries(body []byte, n uint64, entry []byte) ([]byte, error) {
	r := wreader{b: body}
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
	r := wreader{b: body}
	for n := r.u32(); n > 0 && r.err == nil; n-- {
		r.take(int(r.u32())) // module
		r.take(int(r.u32())) // name
		switch kind := r.byte(); kind {
		case 0x00: // function
			r.u32()
		case 0x01: // table
			r.byte()
			r.limits()
		case 0x02: // memory
			r.limits()
			memory = true
		case 0x03: // global
			r.byte()
			r.byte()
			globals++
		default:
			return 0, false, fmt.Errorf("%w: import kind %#x", errUninstrumentable, kind)
		}
	}
	return globals, memory, r.err
}

// checkExports refuses a module that already exports interruptExport or
// exports a global index it does not have (which would be an added one).
func checkExports(body []byte, globals uint32) error {
	r := wreader{b: body}
	for n := r.u32(); n > 0 && r.err == nil; n-- {
		name := r.take(int(r.u32()))
		kind := r.byte()
		idx := r.u32()
		if string(name) == interruptExport {
			return fmt.Errorf("%w: module already exports %s", errUninstrumentable, interruptExport)
		}
		if kind == 0x03 && idx >= globals {
			return fmt.Errorf("%w: export of global index out of range", errUninstrumentable)
		}
	}
	return r.err
}

// instrumentCode inserts check after the block type of every loop. Code
// must only use the module's own globals (fewer than globals): an index that
// was invalid before the rewrite would reach the added ones, and a module
// that clears its interrupt flag cannot be stopped.
func instrumentCode(body, check []byte, globals uint32) ([]byte, error) {
	r := wreader{b: body}
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
		return nil, fmt.Errorf("%w: trailing bytes in code section", errUninstrumentable)
	}
	return out, r.err
}

func instrumentFunction(fn, check []byte, globals uint32) ([]byte, error) {
	r := wreader{b: fn}
	for n := r.u32(); n > 0 && r.err == nil; n-- { // locals
		r.u32()
		r.byte()
	}
	out := make([]byte, 0, len(fn)+64)
	out = append(out, fn[:len(fn)-len(r.b)]...)
	for !r.done() && r.err == nil {
		start := len(fn) - len(r.b)
		op := r.byte()
		loop := false
		switch {
		case op == 0x02 || op == 0x04: // block, if
			r.blockType()
		case op == 0x03: // loop
			r.blockType()
			loop = true
		case op == 0x23 || op == 0x24: // global.get, global.set
			if r.u32() >= globals {
				return nil, fmt.Errorf("%w: global index out of range", errUninstrumentable)
			}
		case op == 0x0C || op == 0x0D || op == 0x10 || // br, br_if, call
			op >= 0x20 && op <= 0x26 || op == 0xD2: // locals, table.get/set, ref.func
			r.u32()
		case op == 0x0E: // br_table
			for k := r.u32(); k > 0 && r.err == nil; k-- {
				r.u32()
			}
			r.u32()
		case op == 0x11: // call_indirect
			r.u32()
			r.u32()
		case op == 0x1C: // select t*
			for k := r.u32(); k > 0 && r.err == nil; k-- {
				r.byte()
			}
		case op >= 0x28 && op <= 0x3E: // loads and stores: memarg
			if align := r.u32(); align&0x40 != 0 {
				return nil, fmt.Errorf("%w: multiple memories", errUninstrumentable)
			}
			r.u64()
		case op == 0x3F || op == 0x40: // memory.size, memory.grow
			if r.byte() != 0 {
				return nil, fmt.Errorf("%w: multiple memories", errUninstrumentable)
			}
		case op == 0x41 || op == 0x42: // i32.const, i64.const
			r.u64()
		case op == 0x43:
			r.take(4)
		case op == 0x44:
			r.take(8)
		case op == 0xD0: // ref.null
			r.byte()
		case op <= 0x01 || op == 0x05 || op == 0x0B || op == 0x0F || op == 0x1A || op == 0x1B ||
			op >= 0x45 && op <= 0xC4 || op == 0xD1:
			// no immediates
		case op == 0xFC:
			switch sub := r.u32(); {
			case sub <= 7: // saturating truncation
			case sub == 8: // memory.init
				r.u32()
				r.byte()
			case sub == 9 || sub == 13 || sub >= 15 && sub <= 17: // data.drop, elem.drop, table.grow/size/fill
				r.u32()
			case sub == 10: // memory.copy
				r.byte()
				r.byte()
			case sub == 11: // memory.fill
				r.byte()
			case sub == 12 || sub == 14: // table.init, table.copy
				r.u32()
				r.u32()
			default:
				return nil, fmt.Errorf("%w: opcode 0xfc %d", errUninstrumentable, sub)
			}
		default:
			return nil, fmt.Errorf("%w: opcode %#x", errUninstrumentable, op)
		}
		out = append(out, fn[start:len(fn)-len(r.b)]...)
		if loop {
			out = append(out, check...)
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	return out, nil
}

// wreader reads the WebAssembly binary format; the first error sticks.
type wreader struct {
	b   []byte
	err error
}

func (r *wreader) done() bool { return len(r.b) == 0 }

func (r *wreader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: truncated or malformed %s", errUninstrumentable, what)
	}
	r.b = nil
}

func (r *wreader) byte() byte {
	if len(r.b) == 0 {
		r.fail("byte")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *wreader) take(n int) []byte {
	if n < 0 || n > len(r.b) {
		r.fail("bytes")
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// u64 reads a LEB128 number (signed ones are skipped the same way).
func (r *wreader) u64() uint64 {
	var v uint64
	for i := 0; i < 10; i++ {
		c := r.byte()
		if r.err != nil {
			return 0
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return v
		}
	}
	r.fail("LEB128")
	return 0
}

func (r *wreader) u32() uint32 {
	v := r.u64()
	if v > 1<<32-1 {
		r.fail("u32")
	}
	return uint32(v)
}

func (r *wreader) limits() {
	switch flag := r.byte(); flag {
	case 0x00:
		r.u64()
	case 0x01, 0x03:
		r.u64()
		r.u64()
	default:
		r.fail(fmt.Sprintf("limits flag %#x", flag))
	}
}

// blockType skips a block type: empty, a value type or a type index (s33).
func (r *wreader) blockType() {
	if len(r.b) > 0 {
		switch r.b[0] {
		case 0x40, 0x7F, 0x7E, 0x7D, 0x7C, 0x7B, 0x70, 0x6F:
			r.b = r.b[1:]
			return
		}
	}
	r.u64()
}

func uleb(v uint64) []byte {
	var b []byte
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}
