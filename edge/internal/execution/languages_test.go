package execution

import (
	"strings"
	"testing"

	"buf.build/gen/go/bufbuild/protovalidate/protocolbuffers/go/buf/validate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	_ "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	_ "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	_ "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	_ "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	_ "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// TestNoLanguageListInTheProtos checks that no field of codemode's protos
// limits a language to a list of names: the agents' table is the only list.
func TestNoLanguageListInTheProtos(t *testing.T) {
	checked, patterned := 0, 0
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), "codemode.") {
			return true
		}
		var walk func(protoreflect.MessageDescriptors)
		walk = func(msgs protoreflect.MessageDescriptors) {
			for i := range msgs.Len() {
				m := msgs.Get(i)
				for j := range m.Fields().Len() {
					f := m.Fields().Get(j)
					if !strings.Contains(string(f.Name()), "language") {
						continue
					}
					checked++
					rules, _ := proto.GetExtension(f.Options(), validate.E_Field).(*validate.FieldRules)
					if in := rules.GetString().GetIn(); len(in) > 0 {
						t.Errorf("%s limits languages to %v", f.FullName(), in)
					}
					if rules.GetString().GetPattern() != "" {
						patterned++
					}
				}
				walk(m.Messages())
			}
		}
		walk(fd.Messages())
		return true
	})
	// The rules were read: the request fields keep the form of a name.
	if checked < 5 || patterned < 5 {
		t.Errorf("checked %d language fields, %d with a pattern; want the request fields of every service", checked, patterned)
	}
	_ = executionv1.File_codemode_execution_v1_execution_proto
}
