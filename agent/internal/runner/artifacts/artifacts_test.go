package artifacts

import "testing"

func TestMediaType(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, content, want string
	}{
		{"a.png", "", "image/png"},
		{"A.PNG", "", "image/png"},
		{"x.svg", "", "image/svg+xml"},
		{"noext", "\x89PNG\r\n\x1a\n", "image/png"},
		{"noext", "hello", "text/plain; charset=utf-8"},
		{"noext", "\x00\x01\x02", "application/octet-stream"},
	} {
		if got := mediaType(tc.name, []byte(tc.content)); got != tc.want {
			t.Errorf("mediaType(%q, %q) = %q, want %q", tc.name, tc.content, got, tc.want)
		}
	}
}
