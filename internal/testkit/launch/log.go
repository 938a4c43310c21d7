package launch

import (
	"fmt"
	"strings"
	"sync"
)

// lineLog keeps lines up to a limit of bytes: a quarter of it for the first
// lines (how the child started), the rest for the latest. When the latest
// outgrow their share, the oldest of them are dropped, a batch at a time.
type lineLog struct {
	mu       sync.Mutex
	limit    int
	head     []string // the first lines, up to limit/4 bytes
	headLen  int
	headFull bool     // head takes no more lines
	tail     []string // the lines after head, oldest first
	tailLen  int
	dropped  int // lines dropped between head and tail
}

func newLineLog(limit int) *lineLog { return &lineLog{limit: limit} }

func (l *lineLog) add(line string) {
	n := len(line) + 1
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.headFull {
		if l.headLen+n <= l.limit/4 {
			l.head = append(l.head, line)
			l.headLen += n
			return
		}
		l.headFull = true
	}
	l.tail = append(l.tail, line)
	l.tailLen += n
	if l.tailLen <= l.limit-l.headLen {
		return
	}
	// Drop down to three quarters of the share, so that dropping (which
	// copies the rest) happens once in many lines.
	keep := (l.limit - l.headLen) * 3 / 4
	i := 0
	for i < len(l.tail) && l.tailLen > keep {
		l.tailLen -= len(l.tail[i]) + 1
		i++
	}
	l.dropped += i
	l.tail = append(l.tail[:0:0], l.tail[i:]...)
}

func (l *lineLog) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, 0, len(l.head)+1+len(l.tail))
	out = append(out, l.head...)
	if l.dropped > 0 {
		out = append(out, fmt.Sprintf("[%d lines left out]", l.dropped))
	}
	return append(out, l.tail...)
}

func (l *lineLog) String() string { return strings.Join(l.lines(), "\n") }
