// Command protocodec is the codec measurement's contender: the same policy
// as handcodec, written over the generated types with
// google.golang.org/protobuf in the guest. It is built by the policy host's
// benchmarks only; see policies/RATIONALE.md.
package main

import (
	"unsafe"

	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"google.golang.org/protobuf/proto"
)

var input, output []byte

//go:wasmexport codemode_abi_version
func abiVersion() uint32 { return 1 }

//go:wasmexport codemode_buffer
func buffer(size uint32) uint32 {
	if uint32(cap(input)) < size || len(input) == 0 {
		input = make([]byte, max(size, 4096))
	}
	return uint32(uintptr(unsafe.Pointer(&input[0])))
}

//go:wasmexport codemode_request
func request(size uint32) uint64 {
	var in policyv1.RequestInput
	if err := proto.Unmarshal(input[:size], &in); err != nil {
		panic(err)
	}
	d := &policyv1.RequestDecision{Verdict: policyv1.Verdict_VERDICT_ALLOW}
	if in.GetExecution().GetLanguage() != "python" {
		d = &policyv1.RequestDecision{Verdict: policyv1.Verdict_VERDICT_DENY, Reason: "only python"}
	}
	var err error
	if output, err = (proto.MarshalOptions{}).MarshalAppend(output[:0], d); err != nil {
		panic(err)
	}
	return uint64(uintptr(unsafe.Pointer(&output[0])))<<32 | uint64(len(output))
}

func main() {}
