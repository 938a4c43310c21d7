package files

import (
	"path"
	"strings"
	"testing"
)

var cleanPathCases = []struct {
	in    string
	dirOK bool
	want  string // "" means refused
}{
	{"a.txt", false, "a.txt"},
	{"a/b/c", false, "a/b/c"},
	{"./a//b/", false, "a/b"},
	{"a/./b", false, "a/b"},
	{"", true, "."},
	{".", true, "."},
	{"", false, ""},
	{".", false, ""},
	{"/etc/passwd", false, ""},
	{"..", true, ""},
	{"../x", false, ""},
	{"a/../../x", false, ""},
	{"a/..", true, ""},
	{"a\x00b", false, ""},
	{"...", false, "..."},
	{"..a", false, "..a"},
}

func TestCleanPath(t *testing.T) {
	t.Parallel()
	for _, tc := range cleanPathCases {
		got, err := cleanPath(tc.in, tc.dirOK)
		if (err != nil) != (tc.want == "") || (err == nil && got != tc.want) {
			t.Errorf("cleanPath(%q, %v) = %q, %v; want %q", tc.in, tc.dirOK, got, err, tc.want)
		}
	}
}

// Whatever cleanPath accepts is a clean relative path with no way up.
func FuzzCleanPath(f *testing.F) {
	for _, tc := range cleanPathCases {
		f.Add(tc.in, tc.dirOK)
	}
	f.Fuzz(func(t *testing.T, in string, dirOK bool) {
		got, err := cleanPath(in, dirOK)
		if err != nil {
			return
		}
		if path.Clean(got) != got || strings.HasPrefix(got, "/") || strings.ContainsRune(got, 0) {
			t.Fatalf("cleanPath(%q) = %q: not clean and relative", in, got)
		}
		for _, el := range strings.Split(got, "/") {
			if el == ".." {
				t.Fatalf("cleanPath(%q) = %q: goes up", in, got)
			}
		}
		if got == "." && !dirOK {
			t.Fatalf("cleanPath(%q) = %q without dirOK", in, got)
		}
	})
}
