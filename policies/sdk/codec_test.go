package sdk

import (
	"bytes"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	policyv1 "github.com/codemode-go/codemode/gen/codemode/policy/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

func fullRequestInput() *policyv1.RequestInput {
	return &policyv1.RequestInput{
		Execution: &executionv1.Execution{
			Language:  "python",
			Code:      strings.Repeat("print('héllo')\n", 20),
			SessionId: "s-1",
			Timeout:   durationpb.New(2*time.Second + 5*time.Millisecond),
			Stdin:     []byte{0, 1, 2, 0xff},
			Files: []*executionv1.File{
				{Path: "a.txt", Content: []byte("A")},
				{Path: "dir/b.bin", Content: nil},
			},
			Limits: &executionv1.Limits{MemoryBytes: 1 << 28, OutputBytes: 4096},
		},
		Tenant:      "acme",
		Door:        "mcp",
		RequestId:   "req-42",
		Subject:     "5d41402abc4b2a76b9719d911017c592",
		Annotations: map[string]string{"k": "v", "empty": ""},
		Egress: &executionv1.Egress{
			Allow: []*executionv1.EgressRule{
				{Host: "api.github.com"},
				{Host: "*.githubusercontent.com", Ports: []uint32{443, 8443, 70000}},
				{Host: "2001:db8::/32", Ports: []uint32{1}},
			},
			Limits: &executionv1.EgressLimits{Connections: 16, Bytes: 1 << 33, ConnectionTime: durationpb.New(90 * time.Second)},
		},
		ApiCall: &policyv1.ApiCall{
			Api: "github", Tool: "github_list_repos", ArgumentsJson: `{"user":"octocat"}`,
			Method: "GET", Url: "https://api.github.com/users/octocat/repos",
		},
	}
}

// fullEgress is fullRequestInput's egress in the SDK's types.
func fullEgress() Egress {
	return Egress{
		Allow: []EgressRule{
			{Host: "api.github.com"},
			{Host: "*.githubusercontent.com", Ports: []uint32{443, 8443, 70000}},
			{Host: "2001:db8::/32", Ports: []uint32{1}},
		},
		Limits: EgressLimits{Connections: 16, Bytes: 1 << 33, ConnectionTime: 90 * time.Second},
	}
}

func TestRequestInputMatchesProtobuf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   *policyv1.RequestInput
		want RequestInput
	}{
		{name: "empty", in: &policyv1.RequestInput{}, want: RequestInput{}},
		{
			name: "full",
			in:   fullRequestInput(),
			want: RequestInput{
				Execution: Execution{
					Language: "python", Code: strings.Repeat("print('héllo')\n", 20), SessionID: "s-1",
					Timeout: 2*time.Second + 5*time.Millisecond, Stdin: []byte{0, 1, 2, 0xff},
					Files:       []File{{Path: "a.txt", Content: []byte("A")}, {Path: "dir/b.bin"}},
					MemoryBytes: 1 << 28, OutputBytes: 4096,
				},
				Tenant: "acme", Door: "mcp", RequestID: "req-42", Subject: "5d41402abc4b2a76b9719d911017c592",
				Annotations: map[string]string{"k": "v", "empty": ""},
				Egress:      fullEgress(),
				APICall: &APICall{
					API: "github", Tool: "github_list_repos", ArgumentsJSON: `{"user":"octocat"}`,
					Method: "GET", URL: "https://api.github.com/users/octocat/repos",
				},
			},
		},
		{
			name: "egress with nothing, empty api call",
			in:   &policyv1.RequestInput{Egress: &executionv1.Egress{Limits: &executionv1.EgressLimits{}}, ApiCall: &policyv1.ApiCall{}},
			want: RequestInput{APICall: &APICall{}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := proto.Marshal(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			var got RequestInput
			if err := got.Unmarshal(b); err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !reflect.DeepEqual(tc.want, got) {
				t.Errorf("decoded input = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestUnmarshalUnpackedPorts checks that ports encoded one field each (as
// protobuf allows for repeated scalars) decode as packed ones do.
func TestUnmarshalUnpackedPorts(t *testing.T) {
	t.Parallel()
	rule := appendString(nil, 1, "a.example")
	rule = appendUint(rule, 2, 443)
	rule = appendPacked(rule, 2, []uint32{8443, 9443})
	rule = appendUint(rule, 2, 80)
	egress := appendLen(nil, 1, len(rule))
	egress = append(egress, rule...)
	b := appendLen(nil, 6, len(egress))
	b = append(b, egress...)
	var in RequestInput
	if err := in.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	want := []EgressRule{{Host: "a.example", Ports: []uint32{443, 8443, 9443, 80}}}
	if !reflect.DeepEqual(in.Egress.Allow, want) {
		t.Errorf("rules = %+v, want %+v", in.Egress.Allow, want)
	}
	var ref policyv1.RequestInput
	if err := proto.Unmarshal(b, &ref); err != nil || !slices.Equal(ref.GetEgress().GetAllow()[0].GetPorts(), want[0].Ports) {
		t.Errorf("protobuf reads %v, %v", ref.GetEgress(), err)
	}
}

func TestUnmarshalSkipsUnknownFields(t *testing.T) {
	t.Parallel()
	b, err := proto.Marshal(fullRequestInput())
	if err != nil {
		t.Fatal(err)
	}
	// Field 99 of each wire type, as a future ABI v1 host may add.
	extra := appendUint(nil, 99, 7)
	extra = appendString(extra, 98, "future")
	extra = append(appendTag(extra, 97, wireFixed32), 1, 2, 3, 4)
	extra = append(appendTag(extra, 96, wireFixed64), 1, 2, 3, 4, 5, 6, 7, 8)
	var plain, withExtra RequestInput
	if err := plain.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	if err := withExtra.Unmarshal(append(extra, b...)); err != nil {
		t.Fatalf("Unmarshal with unknown fields: %v", err)
	}
	if !reflect.DeepEqual(plain, withExtra) {
		t.Errorf("unknown fields changed the result = %+v, want %+v", withExtra, plain)
	}
}

func TestUnmarshalRejectsMalformed(t *testing.T) {
	t.Parallel()
	good, _ := proto.Marshal(fullRequestInput())
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"truncated", good[:len(good)-3]},
		{"field zero", []byte{0x00, 0x01}},
		{"group", []byte{0x0b}},
		{"wrong wire type", []byte{0x10, 0x01}}, // tenant as varint
		{"long varint", bytes.Repeat([]byte{0xff}, 11)},
		{"length past end", []byte{0x12, 0x05, 'a'}},
		{"egress as varint", []byte{0x30, 0x01}},
		{"truncated packed ports", []byte{0x32, 0x04, 0x0a, 0x02, 0x12, 0x05}},
		{"port as fixed32", []byte{0x32, 0x08, 0x0a, 0x06, 0x15, 0x01, 0x02, 0x03, 0x04, 0x00}},
		{"api call truncated", []byte{0x3a, 0x03, 0x0a, 0x05, 'a'}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var in RequestInput
			if err := in.Unmarshal(tc.b); err == nil {
				t.Errorf("Unmarshal(%x) = nil error, want ErrMalformed", tc.b)
			}
		})
	}
}

func TestResultInputMatchesProtobuf(t *testing.T) {
	t.Parallel()
	in := &policyv1.ResultInput{
		Result: &executionv1.Result{
			ExitCode: -1, Stdout: strings.Repeat("x", 300), Stderr: "boom", TimedOut: true, Truncated: true,
			OomKilled: true, Duration: durationpb.New(1500 * time.Millisecond), Agent: "a1", SessionId: "s",
		},
		Tenant: "t", Door: "connect", RequestId: "r", Language: "bash",
		Annotations: map[string]string{"a": "b"},
	}
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var got ResultInput
	if err := got.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	want := ResultInput{
		Result: Result{
			ExitCode: -1, Stdout: strings.Repeat("x", 300), Stderr: "boom", TimedOut: true, Truncated: true,
			OOMKilled: true, Duration: 1500 * time.Millisecond, Agent: "a1", SessionID: "s",
		},
		Tenant: "t", Door: "connect", RequestID: "r", Language: "bash",
		Annotations: map[string]string{"a": "b"},
	}
	if !reflect.DeepEqual(want, got) {
		t.Errorf("decoded input = %+v, want %+v", got, want)
	}
}

func TestRequestDecisionMatchesProtobuf(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		d    RequestDecision
		want *policyv1.RequestDecision
	}{
		{"allow", Allow(), &policyv1.RequestDecision{Verdict: policyv1.Verdict_VERDICT_ALLOW}},
		{"deny", Deny("no"), &policyv1.RequestDecision{Verdict: policyv1.Verdict_VERDICT_DENY, Reason: "no"}},
		{
			name: "everything",
			d: RequestDecision{
				Verdict: VerdictAllow,
				Rewrite: Rewrite{Code: String(strings.Repeat("y", 200)), Language: String(""), SetStdin: true},
				Limits:  Limits{Timeout: 3*time.Second + 7, MemoryBytes: 5, OutputBytes: 1 << 40},
				Route:   map[string]string{"pool": "gpu"}, RoutePriority: -3,
				Annotations: map[string]string{"why": strings.Repeat("z", 130)},
				Egress:      &Egress{Allow: fullEgress().Allow, Limits: EgressLimits{Connections: 2, ConnectionTime: 1500 * time.Millisecond}},
			},
			want: &policyv1.RequestDecision{
				Verdict: policyv1.Verdict_VERDICT_ALLOW,
				Rewrite: &policyv1.Rewrite{Code: proto.String(strings.Repeat("y", 200)), Language: proto.String(""), Stdin: []byte{}},
				Limits: &policyv1.Limits{
					Timeout:     durationpb.New(3*time.Second + 7),
					MemoryBytes: 5, OutputBytes: 1 << 40,
				},
				Route: map[string]string{"pool": "gpu"}, RoutePriority: -3,
				Annotations: map[string]string{"why": strings.Repeat("z", 130)},
				Egress: &executionv1.Egress{
					Allow:  fullRequestInput().Egress.Allow,
					Limits: &executionv1.EgressLimits{Connections: 2, ConnectionTime: durationpb.New(1500 * time.Millisecond)},
				},
			},
		},
		{
			name: "egress: nothing",
			d:    RequestDecision{Verdict: VerdictAllow, Egress: &Egress{}},
			want: &policyv1.RequestDecision{Verdict: policyv1.Verdict_VERDICT_ALLOW, Egress: &executionv1.Egress{}},
		},
		{
			name: "egress: rules of empty hosts and ports",
			d:    RequestDecision{Verdict: VerdictAllow, Egress: &Egress{Allow: []EgressRule{{}, {Ports: []uint32{}}}, Limits: EgressLimits{Bytes: 1}}},
			want: &policyv1.RequestDecision{Verdict: policyv1.Verdict_VERDICT_ALLOW, Egress: &executionv1.Egress{
				Allow: []*executionv1.EgressRule{{}, {}}, Limits: &executionv1.EgressLimits{Bytes: 1},
			}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := tc.d.AppendMarshal(nil)
			var got policyv1.RequestDecision
			if err := proto.Unmarshal(b, &got); err != nil {
				t.Fatalf("proto.Unmarshal: %v", err)
			}
			if !proto.Equal(tc.want, &got) {
				t.Errorf("decision = %v, want %v", &got, tc.want)
			}
			if len(got.ProtoReflect().GetUnknown()) != 0 {
				t.Errorf("decision has unknown fields")
			}
			// With at most one entry per map the bytes are canonical.
			want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(tc.want)
			if !bytes.Equal(b, want) {
				t.Errorf("bytes differ from protobuf's:\n got %x\nwant %x", b, want)
			}
		})
	}
}

func TestResultDecisionMatchesProtobuf(t *testing.T) {
	t.Parallel()
	d := ResultDecision{
		Verdict: VerdictAllow,
		Redactions: []Redaction{
			{Stream: StreamStdout, Start: 0, End: 20, Replacement: "[REDACTED]"},
			{Stream: StreamStderr, Start: 300, End: 400},
		},
		Stdout: String(""), Stderr: String("e"),
		Annotations: map[string]string{"x": "y"},
	}
	want := &policyv1.ResultDecision{
		Verdict: policyv1.Verdict_VERDICT_ALLOW,
		Redactions: []*policyv1.Redaction{
			{Stream: policyv1.Stream_STREAM_STDOUT, End: 20, Replacement: "[REDACTED]"},
			{Stream: policyv1.Stream_STREAM_STDERR, Start: 300, End: 400},
		},
		Stdout: proto.String(""), Stderr: proto.String("e"),
		Annotations: map[string]string{"x": "y"},
	}
	b := d.AppendMarshal(nil)
	var got policyv1.ResultDecision
	if err := proto.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(want, &got) {
		t.Errorf("decision = %v, want %v", &got, want)
	}
	wantBytes, _ := proto.MarshalOptions{Deterministic: true}.Marshal(want)
	if !bytes.Equal(b, wantBytes) {
		t.Errorf("bytes differ from protobuf's:\n got %x\nwant %x", b, wantBytes)
	}
}

// FuzzRequestInput checks that the codec never panics and agrees with
// protobuf on every input protobuf accepts.
func FuzzRequestInput(f *testing.F) {
	good, _ := proto.Marshal(fullRequestInput())
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x02, 0x22, 0x00})
	f.Fuzz(func(t *testing.T, b []byte) {
		var in RequestInput
		err := in.Unmarshal(b)
		var ref policyv1.RequestInput
		refErr := proto.Unmarshal(b, &ref)
		if refErr != nil || err != nil {
			return // protobuf is laxer about some encodings (e.g. packed), or stricter about UTF-8
		}
		e := ref.GetExecution()
		want := RequestInput{
			Tenant: ref.GetTenant(), Door: ref.GetDoor(), RequestID: ref.GetRequestId(), Subject: ref.GetSubject(),
			Execution: Execution{
				Language: e.GetLanguage(), Code: e.GetCode(), SessionID: e.GetSessionId(),
				Timeout: e.GetTimeout().AsDuration(), Stdin: e.GetStdin(),
				MemoryBytes: e.GetLimits().GetMemoryBytes(), OutputBytes: e.GetLimits().GetOutputBytes(),
			},
		}
		if len(ref.GetAnnotations()) > 0 {
			want.Annotations = ref.GetAnnotations()
		}
		eg := ref.GetEgress()
		for _, r := range eg.GetAllow() {
			want.Egress.Allow = append(want.Egress.Allow, EgressRule{Host: r.GetHost(), Ports: r.GetPorts()})
		}
		want.Egress.Limits = EgressLimits{
			Connections: eg.GetLimits().GetConnections(), Bytes: eg.GetLimits().GetBytes(),
			ConnectionTime: eg.GetLimits().GetConnectionTime().AsDuration(),
		}
		if c := ref.ApiCall; c != nil {
			want.APICall = &APICall{API: c.GetApi(), Tool: c.GetTool(), ArgumentsJSON: c.GetArgumentsJson(), Method: c.GetMethod(), URL: c.GetUrl()}
		}
		for _, f := range e.GetFiles() {
			want.Execution.Files = append(want.Execution.Files, File{Path: f.GetPath(), Content: f.GetContent()})
		}
		if !reflect.DeepEqual(normalize(want), normalize(in)) {
			t.Errorf("codec and protobuf disagree on %x:\n codec %+v\n proto %+v", b, in, want)
		}
	})
}

// normalize maps empty byte slices to nil, which protobuf does not distinguish.
func normalize(in RequestInput) RequestInput {
	if len(in.Execution.Stdin) == 0 {
		in.Execution.Stdin = nil
	}
	files := make([]File, len(in.Execution.Files))
	for i, f := range in.Execution.Files {
		if len(f.Content) == 0 {
			f.Content = nil
		}
		files[i] = f
	}
	if len(files) == 0 {
		files = nil
	}
	in.Execution.Files = files
	for i := range in.Egress.Allow {
		if len(in.Egress.Allow[i].Ports) == 0 {
			in.Egress.Allow[i].Ports = nil
		}
	}
	return in
}
