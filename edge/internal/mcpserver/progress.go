package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// maxProgressMessage bounds the text of one progress notification; output
// produced faster than that is cut in the notification (never in the
// result, which carries all of it).
const maxProgressMessage = 16 << 10

// progress sends a run's output to the client as progress notifications
// while the run goes on: what came since the last one, at most once per
// interval, and a heartbeat when nothing came for a while, so that clients
// that reset their request timeout on progress keep waiting.
type progress struct {
	session *mcp.ServerSession
	token   any
	start   time.Time

	mu      sync.Mutex
	pending strings.Builder
	dropped int
	sent    float64 // the progress value: notifications sent so far
	last    time.Time

	kick chan struct{}
	done chan struct{}
	wg   sync.WaitGroup
}

func newProgress(ctx context.Context, session *mcp.ServerSession, token any, every, heartbeat time.Duration) *progress {
	p := &progress{session: session, token: token, start: time.Now(), last: time.Now(),
		kick: make(chan struct{}, 1), done: make(chan struct{})}
	p.wg.Add(1)
	go p.run(ctx, every, heartbeat)
	return p
}

// add queues output for the next notification.
func (p *progress) add(s string) {
	p.mu.Lock()
	if room := maxProgressMessage - p.pending.Len(); len(s) > room {
		p.dropped += len(s) - max(room, 0)
		s = s[:max(room, 0)]
	}
	p.pending.WriteString(s)
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// stop sends what is pending and stops; the result goes after it.
func (p *progress) stop() {
	close(p.done)
	p.wg.Wait()
}

func (p *progress) run(ctx context.Context, every, heartbeat time.Duration) {
	defer p.wg.Done()
	beat := time.NewTicker(heartbeat / 4)
	defer beat.Stop()
	for {
		select {
		case <-p.done:
			p.flush(ctx, false)
			return
		case <-ctx.Done():
			return
		case <-p.kick:
			// Coalesce: output that comes within the interval goes in one
			// notification (a line and its newline often come apart).
			select {
			case <-time.After(every):
			case <-p.done:
			case <-ctx.Done():
			}
			p.flush(ctx, false)
		case <-beat.C:
			p.mu.Lock()
			quiet := time.Since(p.last) >= heartbeat
			p.mu.Unlock()
			if quiet {
				p.flush(ctx, true)
			}
		}
	}
}

// flush sends the pending output, or with heartbeat a note that the run
// goes on when nothing is pending.
func (p *progress) flush(ctx context.Context, heartbeat bool) {
	p.mu.Lock()
	msg := p.pending.String()
	if p.dropped > 0 {
		msg += fmt.Sprintf("\n[%d bytes more; the result has all the output]\n", p.dropped)
	}
	if msg == "" && heartbeat {
		msg = fmt.Sprintf("[running for %s]", time.Since(p.start).Round(time.Second))
	}
	if msg == "" {
		p.mu.Unlock()
		return
	}
	p.pending.Reset()
	p.dropped = 0
	p.sent++
	n := p.sent
	p.last = time.Now()
	p.mu.Unlock()
	// A client that went away ends the run through ctx; a failed
	// notification on its own is no reason to stop the program.
	_ = p.session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: p.token, Message: msg, Progress: n})
}
