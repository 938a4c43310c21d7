package runner

import (
	"context"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/codemode-go/codemode/agent/internal/languages"
	"github.com/codemode-go/codemode/agent/internal/runner/proc"
)

// versions asks each language's program for its version, all at once, as
// the user, for the Ready event. A program that is missing or slow is left
// out. The agent asks only until one runner has answered (the image is the
// same for all), so the wait is paid once, and is long enough for a loaded
// host.
func (s *server) versions(ctx context.Context) map[string]string {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		out = make(map[string]string)
	)
	for _, lang := range languages.All() {
		if lang.Version == nil {
			continue
		}
		wg.Go(func() {
			if v := s.probe(ctx, lang.Version); v != "" {
				mu.Lock()
				out[lang.Name] = strings.TrimPrefix(v, "v")
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// probe runs argv and returns the first line of its stdout.
func (s *server) probe(ctx context.Context, argv []string) string {
	r, w, err := os.Pipe()
	if err != nil {
		return ""
	}
	p, err := s.procs.Start(proc.Spec{Argv: argv, Env: []string{"PATH=" + s.cfg.path, "LANG=C.UTF-8"}, Files: []*os.File{nil, w, nil}})
	w.Close()
	if err != nil {
		r.Close()
		return ""
	}
	var b []byte
	read := make(chan struct{})
	go func() {
		defer close(read)
		b, _ = io.ReadAll(io.LimitReader(r, 256))
		r.Close()
	}()
	select {
	case <-p.Done():
	case <-ctx.Done():
		proc.KillGroup(p.Pid)
		<-p.Done()
	}
	<-read
	if proc.ExitCode(p.Status()) != 0 {
		return ""
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line)
}
