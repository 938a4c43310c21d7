// Command apiguard is a request-phase policy for the tests of API calls:
// it denies a call of the API tool named in its configuration, with a
// reason that repeats what it saw of the call (tenant, door, and every
// field of api_call), and allows everything else. It decodes the protobuf
// input by hand, as policies/ABI.md allows, to stay small: a module with
// the protobuf runtime takes tens of seconds to compile under the race
// detector.
package main

import "unsafe"

var input, output []byte

var blocked string

//go:wasmexport codemode_abi_version
func abiVersion() uint32 { return 1 }

//go:wasmexport codemode_buffer
func buffer(size uint32) uint32 {
	if uint32(cap(input)) < size || len(input) == 0 {
		input = make([]byte, max(size, 4096))
	}
	return uint32(uintptr(unsafe.Pointer(&input[0])))
}

//go:wasmexport codemode_init
func initConfig(size uint32) uint64 {
	blocked = string(input[:size])
	return 0
}

// fields returns the length-delimited fields of a message by number (the
// last of each), skipping the others.
func fields(b []byte) map[uint64][]byte {
	out := map[uint64][]byte{}
	for len(b) > 0 {
		key, n := varint(b)
		b = b[n:]
		switch key & 7 {
		case 0:
			_, n = varint(b)
			b = b[n:]
		case 1:
			b = b[8:]
		case 5:
			b = b[4:]
		case 2:
			l, n := varint(b)
			out[key>>3] = b[n : n+int(l)]
			b = b[n+int(l):]
		default:
			panic("wire type")
		}
	}
	return out
}

func varint(b []byte) (v uint64, n int) {
	for shift := uint(0); ; shift += 7 {
		c := b[n]
		n++
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, n
		}
	}
}

func appendVarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

//go:wasmexport codemode_request
func request(size uint32) uint64 {
	in := fields(input[:size])
	output = append(output[:0], 0x08, 0x01) // verdict: allow
	if call, ok := in[7]; ok {
		c := fields(call)
		if string(c[2]) == blocked {
			reason := string(c[2]) + " is off for " + string(in[2]) + " at door " + string(in[3]) + ": " +
				string(c[4]) + " " + string(c[5]) + " " + string(c[3]) + " on " + string(c[1])
			output = append(output[:0], 0x08, 0x02, 0x12) // verdict: deny, reason:
			output = appendVarint(output, uint64(len(reason)))
			output = append(output, reason...)
		}
	}
	return uint64(uintptr(unsafe.Pointer(&output[0])))<<32 | uint64(len(output))
}

func main() {}
