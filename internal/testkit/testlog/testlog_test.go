package testlog

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestBuffer writes from many goroutines while reading (run it with -race):
// every write is there, whole.
func TestBuffer(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				fmt.Fprintf(&b, "w%d-%d\n", i, j)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 800 {
		t.Fatalf("%d lines, want 800", len(lines))
	}
	for i := range 8 {
		for j := range 100 {
			if !strings.Contains(b.String(), fmt.Sprintf("w%d-%d\n", i, j)) {
				t.Fatalf("w%d-%d is missing", i, j)
			}
		}
	}
}

func TestTail(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{{"abcdef", 3, "def"}, {"abc", 3, "abc"}, {"ab", 3, "ab"}, {"", 3, ""}} {
		if got := Tail(c.s, c.n); got != c.want {
			t.Errorf("Tail(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}
