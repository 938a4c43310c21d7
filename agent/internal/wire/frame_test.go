package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

func frame(body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	return append(b, body...)
}

func mustMarshal(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

var roundTripRequests = []*runnerv1.Request{
	{},
	{Id: 1, Kind: &runnerv1.Request_Run{Run: &runnerv1.Run{Language: "python", Code: "print(1)", Timeout: durationpb.New(2e9), OutputLimit: 1 << 20}}},
	{Id: 2, Kind: &runnerv1.Request_Cancel{Cancel: &runnerv1.Cancel{RunId: 1}}},
	{Id: 3, Kind: &runnerv1.Request_Reset_{Reset_: &runnerv1.Reset{}}},
	{Id: 4, Kind: &runnerv1.Request_WriteFile{WriteFile: &runnerv1.WriteFile{File: &runnerv1.File{Path: "a/b.txt", Content: bytes.Repeat([]byte{0, 0xff}, 70000), Mode: 0o600}}}},
	{Id: 1<<64 - 1, Kind: &runnerv1.Request_ListFiles{ListFiles: &runnerv1.ListFiles{}}},
}

func TestFrameRoundTrip(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	for _, m := range roundTripRequests {
		if err := WriteFrame(&buf, m); err != nil {
			t.Fatalf("WriteFrame(%v): %v", m, err)
		}
	}
	for i, want := range roundTripRequests {
		got := &runnerv1.Request{Id: 99} // ReadFrame must reset it
		if err := ReadFrame(&buf, got); err != nil {
			t.Fatalf("ReadFrame #%d: %v", i, err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("ReadFrame #%d = %v, want %v", i, got, want)
		}
	}
	if err := ReadFrame(&buf, &runnerv1.Request{}); err != io.EOF {
		t.Fatalf("ReadFrame at end = %v, want io.EOF", err)
	}
}

var readFrameCases = []struct {
	name    string
	in      []byte
	wantErr error // nil: success; errAny: any error
}{
	{"empty message", frame(nil), nil},
	{"run", frame(mustMarshal(roundTripRequests[1])), nil},
	{"clean end", nil, io.EOF},
	{"short header", []byte{0, 0}, io.ErrUnexpectedEOF},
	{"short body", append(binary.BigEndian.AppendUint32(nil, 10), 1, 2, 3), io.ErrUnexpectedEOF},
	{"header only", binary.BigEndian.AppendUint32(nil, 5), io.ErrUnexpectedEOF},
	{"too large", binary.BigEndian.AppendUint32(nil, MaxFrameSize+1), ErrFrameTooLarge},
	{"huge", []byte{0xff, 0xff, 0xff, 0xff}, ErrFrameTooLarge},
	{"largest allowed length, short body", binary.BigEndian.AppendUint32(nil, MaxFrameSize), io.ErrUnexpectedEOF},
	{"invalid protobuf", frame([]byte{0xff, 0xff, 0xff}), errAny},
	{"truncated varint", frame([]byte{0x08, 0xff}), errAny},
}

var errAny = errors.New("any error")

func TestReadFrame(t *testing.T) {
	t.Parallel()
	for _, tc := range readFrameCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := ReadFrame(bytes.NewReader(tc.in), &runnerv1.Request{})
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("ReadFrame: %v", err)
			case tc.wantErr == errAny && err == nil:
				t.Fatal("ReadFrame: no error")
			case tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Fatalf("ReadFrame: %v, want %v", err, tc.wantErr)
			}
		})
	}
}

func TestWriteFrameTooLarge(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	m := &runnerv1.Request{Kind: &runnerv1.Request_WriteFile{WriteFile: &runnerv1.WriteFile{File: &runnerv1.File{Content: make([]byte, MaxFrameSize)}}}}
	if err := WriteFrame(&buf, m); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("WriteFrame = %v, want ErrFrameTooLarge", err)
	}
	if buf.Len() != 0 {
		t.Fatalf("WriteFrame wrote %d bytes of a frame it refused", buf.Len())
	}
}

// countingWriter counts Write calls: a frame must be one call.
type countingWriter struct {
	bytes.Buffer
	calls int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.calls++
	return w.Buffer.Write(p)
}

func TestWriteFrameSingleWrite(t *testing.T) {
	t.Parallel()
	for _, m := range roundTripRequests {
		var w countingWriter
		if err := WriteFrame(&w, m); err != nil {
			t.Fatal(err)
		}
		if w.calls != 1 {
			t.Fatalf("WriteFrame made %d Write calls, want 1", w.calls)
		}
		if got, want := w.Len(), headerSize+proto.Size(m); got != want {
			t.Fatalf("frame is %d bytes, want %d", got, want)
		}
	}
}

func FuzzReadFrame(f *testing.F) {
	for _, tc := range readFrameCases {
		f.Add(tc.in)
	}
	for _, m := range roundTripRequests[:4] {
		f.Add(frame(mustMarshal(m)))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bytes.NewReader(in)
		for {
			var m runnerv1.Request
			if err := ReadFrame(r, &m); err != nil {
				return
			}
			// Whatever decodes must survive a round trip.
			var buf bytes.Buffer
			if err := WriteFrame(&buf, &m); err != nil {
				t.Fatalf("WriteFrame of a decoded message: %v", err)
			}
			var again runnerv1.Request
			if err := ReadFrame(&buf, &again); err != nil {
				t.Fatalf("ReadFrame of a re-encoded message: %v", err)
			}
			if !proto.Equal(&m, &again) {
				t.Fatalf("round trip changed %v into %v", &m, &again)
			}
		}
	})
}

func BenchmarkWriteFrame(b *testing.B) {
	ev := &runnerv1.Event{Id: 7, Kind: &runnerv1.Event_Stdout{Stdout: bytes.Repeat([]byte("x"), 4096)}}
	b.ReportAllocs()
	b.SetBytes(int64(proto.Size(ev) + headerSize))
	for b.Loop() {
		if err := WriteFrame(io.Discard, ev); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadFrame(b *testing.B) {
	ev := &runnerv1.Event{Id: 7, Kind: &runnerv1.Event_Stdout{Stdout: bytes.Repeat([]byte("x"), 4096)}}
	var buf bytes.Buffer
	if err := WriteFrame(&buf, ev); err != nil {
		b.Fatal(err)
	}
	raw := buf.Bytes()
	r := bytes.NewReader(raw)
	var got runnerv1.Event
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		r.Reset(raw)
		if err := ReadFrame(r, &got); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFrameRoundTripSmall(b *testing.B) {
	req := &runnerv1.Request{Id: 1, Kind: &runnerv1.Request_Run{Run: &runnerv1.Run{Language: "python", Code: "print(1)", Stateful: true}}}
	var buf bytes.Buffer
	var got runnerv1.Request
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if err := WriteFrame(&buf, req); err != nil {
			b.Fatal(err)
		}
		if err := ReadFrame(&buf, &got); err != nil {
			b.Fatal(err)
		}
	}
}
