//go:build wasip1

package sdk

import "unsafe"

// The exports of ABI v1 (policies/ABI.md). Only one call runs at a time in
// an instance, so the package state below needs no locking.

var (
	requestHandler func(*RequestInput) RequestDecision
	resultHandler  func(*ResultInput) ResultDecision
	initHandler    func(config []byte) error

	// input is the stable buffer the host writes into; it only grows.
	input []byte
	// output holds the last answer until the next call.
	output []byte

	requestIn RequestInput
	resultIn  ResultInput
)

func handleRequest(f func(*RequestInput) RequestDecision) { requestHandler = f }
func handleResult(f func(*ResultInput) ResultDecision)    { resultHandler = f }
func handleInit(f func([]byte) error)                     { initHandler = f }

//go:wasmexport codemode_abi_version
func abiVersion() uint32 { return 1 }

//go:wasmexport codemode_buffer
func buffer(size uint32) uint32 {
	if size < 4096 {
		size = 4096
	}
	if uint32(cap(input)) < size {
		input = make([]byte, size)
	}
	input = input[:cap(input)]
	return uint32(uintptr(unsafe.Pointer(&input[0])))
}

// answer packs the output's address and length as the host reads them.
func answer() uint64 {
	if len(output) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&output[0])))<<32 | uint64(len(output))
}

//go:wasmexport codemode_init
func initConfig(size uint32) uint64 {
	output = output[:0]
	if initHandler == nil {
		return 0
	}
	config := append([]byte(nil), input[:size]...)
	if err := initHandler(config); err != nil {
		output = append(output, err.Error()...)
		if len(output) == 0 {
			output = append(output, "init failed"...)
		}
	}
	return answer()
}

//go:wasmexport codemode_request
func request(size uint32) uint64 {
	if requestHandler == nil {
		panic("codemode policy: no request handler registered")
	}
	// The input is copied once: the decoded strings alias the copy, so they
	// stay valid after the host overwrites the buffer.
	if err := requestIn.Unmarshal(append([]byte(nil), input[:size]...)); err != nil {
		panic("codemode policy: decode request input: " + err.Error())
	}
	d := requestHandler(&requestIn)
	output = d.AppendMarshal(output[:0])
	return answer()
}

//go:wasmexport codemode_result
func result(size uint32) uint64 {
	if resultHandler == nil {
		panic("codemode policy: no result handler registered")
	}
	if err := resultIn.Unmarshal(append([]byte(nil), input[:size]...)); err != nil {
		panic("codemode policy: decode result input: " + err.Error())
	}
	d := resultHandler(&resultIn)
	output = d.AppendMarshal(output[:0])
	return answer()
}
