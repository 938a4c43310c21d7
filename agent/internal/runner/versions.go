package runner

import (
	"context"
	"io"
	"os"
	"slices"
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
			stdout, _ := s.probe(ctx, lang.Version)
			v, _, _ := strings.Cut(stdout, "\n")
			if v = strings.TrimSpace(v); v != "" {
				mu.Lock()
				out[lang.Name] = strings.TrimPrefix(v, "v")
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// preloadMissing returns the modules of the runner's -preload list that
// the image lacks, asked of the language that preloads them, so that the
// agent says only what is imported ahead (and warns about the rest once).
// Nothing if the probe fails: the parent still skips what it cannot import.
func (s *server) preloadMissing(ctx context.Context) []string {
	if len(s.cfg.preload) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for _, lang := range languages.All() {
		if lang.Parent == nil || lang.PreloadProbe == nil {
			continue
		}
		stdout, ok := s.probe(ctx, append(slices.Clip(lang.PreloadProbe), s.cfg.preload...))
		if !ok {
			return nil // the parent still says what it skips, in the runner's log
		}
		has := strings.Fields(stdout)
		var missing []string
		for _, m := range s.cfg.preload {
			if !slices.Contains(has, m) {
				missing = append(missing, m)
			}
		}
		return missing
	}
	return nil
}

// probe runs argv and returns its stdout (4 KiB at most), and whether it
// exited with 0.
func (s *server) probe(ctx context.Context, argv []string) (string, bool) {
	r, w, err := os.Pipe()
	if err != nil {
		return "", false
	}
	p, err := s.procs.Start(proc.Spec{Argv: argv, Env: []string{"PATH=" + s.cfg.path, "LANG=C.UTF-8"}, Files: []*os.File{nil, w, nil}})
	w.Close()
	if err != nil {
		r.Close()
		return "", false
	}
	var b []byte
	read := make(chan struct{})
	go func() {
		defer close(read)
		b, _ = io.ReadAll(io.LimitReader(r, 4<<10))
		r.Close()
	}()
	select {
	case <-p.Done():
	case <-ctx.Done():
		proc.KillGroup(p.Pid)
		<-p.Done()
	}
	<-read
	return string(b), proc.ExitCode(p.Status()) == 0
}
