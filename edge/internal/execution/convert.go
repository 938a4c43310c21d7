package execution

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// The public requests that run code (codemode.edge.v1.ExecuteRequest and
// ExecuteStreamRequest) carry the fields of codemode.execution.v1.Execution
// with the same numbers and types, so that the public API stays flat (as
// curl users write it) while a run travels from door to runner as one
// message. Converting through the wire format means that a field added to
// Execution and to the requests reaches the agents without a copy to keep in
// step; a test checks that the messages agree field by field.

// Convert copies the fields of src into dst through the wire format. src
// and dst must be messages whose fields agree (see above).
func Convert(dst, src proto.Message) error {
	b, err := proto.Marshal(src)
	if err != nil {
		return fmt.Errorf("convert %s: %w", src.ProtoReflect().Descriptor().FullName(), err)
	}
	if err := proto.Unmarshal(b, dst); err != nil {
		return fmt.Errorf("convert to %s: %w", dst.ProtoReflect().Descriptor().FullName(), err)
	}
	return nil
}

// FromRequest returns the Execution a public request carries.
func FromRequest(req proto.Message) (*executionv1.Execution, error) {
	ex := &executionv1.Execution{}
	if err := Convert(ex, req); err != nil {
		return nil, err
	}
	return ex, nil
}
