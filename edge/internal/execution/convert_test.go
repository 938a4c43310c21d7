package execution

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// TestRequestsCarryExecution checks that the public requests that run code
// have exactly Execution's fields (numbers, names, types), so that Convert
// loses nothing either way: a field added to one and not the others fails
// here instead of being dropped on the way.
func TestRequestsCarryExecution(t *testing.T) {
	want := (&executionv1.Execution{}).ProtoReflect().Descriptor().Fields()
	for _, m := range []proto.Message{&edgev1.ExecuteRequest{}, &edgev1.ExecuteStreamRequest{}} {
		got := m.ProtoReflect().Descriptor().Fields()
		name := m.ProtoReflect().Descriptor().FullName()
		if got.Len() != want.Len() {
			t.Errorf("%s has %d fields, Execution %d", name, got.Len(), want.Len())
		}
		for i := range want.Len() {
			w := want.Get(i)
			g := got.ByNumber(w.Number())
			if g == nil {
				t.Errorf("%s lacks Execution's field %d (%s)", name, w.Number(), w.Name())
				continue
			}
			if g.Name() != w.Name() || g.Kind() != w.Kind() || g.Cardinality() != w.Cardinality() || typeName(g) != typeName(w) {
				t.Errorf("%s field %d is %s %v %s, Execution's is %s %v %s", name, w.Number(), g.Name(), g.Kind(), typeName(g), w.Name(), w.Kind(), typeName(w))
			}
		}
	}
}

func typeName(f protoreflect.FieldDescriptor) protoreflect.FullName {
	if m := f.Message(); m != nil {
		return m.FullName()
	}
	return ""
}

func TestConvertRoundTrip(t *testing.T) {
	ex := &executionv1.Execution{
		Language: "python", Code: "print(1)", SessionId: "s1", Timeout: durationpb.New(3 * time.Second),
		Stdin: []byte("in"), Files: []*executionv1.File{{Path: "a.txt", Content: []byte("a")}},
		Limits: &executionv1.Limits{MemoryBytes: 1 << 28, OutputBytes: 1 << 20},
	}
	req := &edgev1.ExecuteStreamRequest{}
	if err := Convert(req, ex); err != nil {
		t.Fatal(err)
	}
	back, err := FromRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back, ex) {
		t.Errorf("round trip: got %v, want %v", back, ex)
	}
	if req.GetCode() != "print(1)" || req.GetLimits().GetOutputBytes() != 1<<20 {
		t.Errorf("request: %v", req)
	}
}
