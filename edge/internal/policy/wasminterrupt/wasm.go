package wasminterrupt

import "fmt"

// The parts of the WebAssembly binary format
// (https://webassembly.github.io/spec/core/binary/) that the rewriter reads
// or writes.

// magic and version open every WebAssembly 1.0 binary.
const (
	magic   = "\x00asm"
	version = "\x01\x00\x00\x00"
)

// Section ids, in the order the sections must appear (data count, 12, comes
// between element and code).
const (
	sectionCustom    byte = 0
	sectionType      byte = 1
	sectionImport    byte = 2
	sectionFunction  byte = 3
	sectionTable     byte = 4
	sectionMemory    byte = 5
	sectionGlobal    byte = 6
	sectionExport    byte = 7
	sectionStart     byte = 8
	sectionElement   byte = 9
	sectionCode      byte = 10
	sectionData      byte = 11
	sectionDataCount byte = 12
)

// External kinds of imports and exports.
const (
	externFunc   byte = 0x00
	externTable  byte = 0x01
	externMemory byte = 0x02
	externGlobal byte = 0x03
)

// Value types, and the empty block type.
const (
	typeI32       byte = 0x7F
	typeI64       byte = 0x7E
	typeF32       byte = 0x7D
	typeF64       byte = 0x7C
	typeV128      byte = 0x7B
	typeFuncref   byte = 0x70
	typeExternref byte = 0x6F
	blockEmpty    byte = 0x40
)

// globalVar marks a global mutable.
const globalVar byte = 0x01

// Flags of a limits entry (tables and memories): min only, min and max,
// and min and max of a shared memory (threads proposal).
const (
	limitsMin       byte = 0x00
	limitsMinMax    byte = 0x01
	limitsSharedMax byte = 0x03
)

// memargMultiMemory is the bit of a memarg's alignment field that announces
// a memory index (multi-memory proposal).
const memargMultiMemory = 0x40

// Opcodes. Where the rewriter treats a contiguous range alike, its first and
// last opcodes are named.
const (
	opUnreachable   byte = 0x00
	opNop           byte = 0x01
	opBlock         byte = 0x02
	opLoop          byte = 0x03
	opIf            byte = 0x04
	opElse          byte = 0x05
	opEnd           byte = 0x0B
	opBr            byte = 0x0C
	opBrIf          byte = 0x0D
	opBrTable       byte = 0x0E
	opReturn        byte = 0x0F
	opCall          byte = 0x10
	opCallIndirect  byte = 0x11
	opDrop          byte = 0x1A
	opSelect        byte = 0x1B
	opSelectTyped   byte = 0x1C
	opLocalGet      byte = 0x20 // first of local.get/set/tee, global.get/set, table.get/set
	opGlobalGet     byte = 0x23
	opGlobalSet     byte = 0x24
	opTableSet      byte = 0x26 // last of the index-immediate range above
	opI32Load       byte = 0x28 // first load or store (immediate: memarg)
	opI64Store32    byte = 0x3E // last load or store
	opMemorySize    byte = 0x3F
	opMemoryGrow    byte = 0x40
	opI32Const      byte = 0x41
	opI64Const      byte = 0x42
	opF32Const      byte = 0x43
	opF64Const      byte = 0x44
	opI32Eqz        byte = 0x45 // first numeric instruction without immediates
	opI64Eqz        byte = 0x50
	opI64LtU        byte = 0x54
	opI32Sub        byte = 0x6B
	opI64Sub        byte = 0x7D
	opI32WrapI64    byte = 0xA7
	opI64ExtendI32U byte = 0xAD
	opI64Extend32S  byte = 0xC4 // last numeric instruction without immediates
	opRefNull       byte = 0xD0
	opRefIsNull     byte = 0xD1
	opRefFunc       byte = 0xD2
	opPrefixFC      byte = 0xFC // saturating truncation, bulk memory and table instructions
)

// Instructions under opPrefixFC, by their u32 sub-opcode.
const (
	fcI64TruncSatF64U uint32 = 7 // last of the saturating truncations, 0 to 7
	fcMemoryInit      uint32 = 8
	fcDataDrop        uint32 = 9
	fcMemoryCopy      uint32 = 10
	fcMemoryFill      uint32 = 11
	fcTableInit       uint32 = 12
	fcElemDrop        uint32 = 13
	fcTableCopy       uint32 = 14
	fcTableGrow       uint32 = 15
	fcTableSize       uint32 = 16
	fcTableFill       uint32 = 17
)

// reader reads the WebAssembly binary format; the first error sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) done() bool { return len(r.b) == 0 }

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: truncated or malformed %s", ErrUninstrumentable, what)
	}
	r.b = nil
}

func (r *reader) byte() byte {
	if len(r.b) == 0 {
		r.fail("byte")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) take(n int) []byte {
	if n < 0 || n > len(r.b) {
		r.fail("bytes")
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// u64 reads a LEB128 number (signed ones are skipped the same way).
func (r *reader) u64() uint64 {
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

func (r *reader) u32() uint32 {
	v := r.u64()
	if v > 1<<32-1 {
		r.fail("u32")
	}
	return uint32(v)
}

// limits skips a limits entry.
func (r *reader) limits() {
	switch flag := r.byte(); flag {
	case limitsMin:
		r.u64()
	case limitsMinMax, limitsSharedMax:
		r.u64()
		r.u64()
	default:
		r.fail(fmt.Sprintf("limits flag %#x", flag))
	}
}

// blockType skips a block type: empty, a value type or a type index (s33).
func (r *reader) blockType() {
	if len(r.b) > 0 {
		switch r.b[0] {
		case blockEmpty, typeI32, typeI64, typeF32, typeF64, typeV128, typeFuncref, typeExternref:
			r.b = r.b[1:]
			return
		}
	}
	r.u64()
}

// uleb encodes v as unsigned LEB128.
func uleb(v uint64) []byte {
	var b []byte
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}
