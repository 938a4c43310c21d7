package agentd

import (
	"bytes"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestUTF8Decoder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		chunks []string
		want   string
	}{
		{"ascii", []string{"hello ", "world\n"}, "hello world\n"},
		{"split two-byte", []string{"caf\xc3", "\xa9!"}, "café!"},
		{"split three-byte at every byte", []string{"\xe2", "\x82", "\xac"}, "€"},
		{"split four-byte", []string{"a\xf0\x9f", "\x98\x80b"}, "a😀b"},
		{"invalid byte", []string{"a\xffb"}, "a\uFFFDb"},
		{"each invalid byte replaced", []string{"\xff\xfe"}, "\uFFFD\uFFFD"},
		{"truncated at end", []string{"ok\xe2\x82"}, "ok\uFFFD\uFFFD"},
		{"broken sequence then ascii", []string{"\xe2", "x"}, "\uFFFDx"},
		{"continuation without start", []string{"\x80", "a"}, "\uFFFDa"},
		{"empty chunks", []string{"", "\xc3", "", "\xa9"}, "é"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var d utf8Decoder
			var got strings.Builder
			for _, c := range tt.chunks {
				s := d.Decode([]byte(c))
				if !utf8.ValidString(s) {
					t.Fatalf("Decode(%q) = %q: not valid UTF-8", c, s)
				}
				got.WriteString(s)
			}
			got.WriteString(d.Flush())
			if got.String() != tt.want {
				t.Errorf("got %q, want %q", got.String(), tt.want)
			}
		})
	}
}

// FuzzUTF8Decoder checks that however a stream is cut into chunks, the
// decoder's output is valid UTF-8 and equals the whole stream decoded at once.
func FuzzUTF8Decoder(f *testing.F) {
	f.Add([]byte("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), uint8(3))
	f.Add([]byte("\xff\xfe\xc3"), uint8(1))
	f.Add([]byte("a\xe2\x82b"), uint8(2))
	f.Fuzz(func(t *testing.T, data []byte, cut uint8) {
		step := int(cut%7) + 1
		var d utf8Decoder
		var got strings.Builder
		for i := 0; i < len(data); i += step {
			s := d.Decode(data[i:min(i+step, len(data))])
			if !utf8.ValidString(s) {
				t.Fatalf("invalid output %q", s)
			}
			got.WriteString(s)
		}
		got.WriteString(d.Flush())
		if want := toValid(data); got.String() != want {
			t.Fatalf("chunked %q != whole %q", got.String(), want)
		}
		if utf8.Valid(data) && !bytes.Equal([]byte(got.String()), data) {
			t.Fatal("valid input changed")
		}
	})
}

func BenchmarkUTF8Decoder(b *testing.B) {
	for _, tc := range []struct {
		name  string
		chunk []byte
	}{
		{"ascii 32KiB", bytes.Repeat([]byte("x"), 32<<10)},
		{"multibyte split 32KiB", bytes.Repeat([]byte("€"), 32<<10/3+1)[:32<<10]},
		{"invalid 32KiB", bytes.Repeat([]byte{0xff, 'a'}, 16<<10)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(tc.chunk)))
			var d utf8Decoder
			for b.Loop() {
				_ = d.Decode(tc.chunk)
			}
		})
	}
}
