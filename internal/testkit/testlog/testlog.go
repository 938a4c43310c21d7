// Package testlog holds what tests use to read what a logger or a process
// wrote while it runs.
package testlog

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that a logger (or a process's output) and a test
// may share: its writes and reads are safe for concurrent use. The zero
// value is an empty buffer ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Tail returns the last n bytes of s, or s if it is shorter: the end of a
// log, which says what happened last, for a failure's message.
func Tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
