package runner

import (
	"os"

	"github.com/codemode-go/codemode/agent/internal/runner/preload"
	"github.com/codemode-go/codemode/agent/internal/runner/proc"
)

// The runner's side of the preloaded parent (see package preload): when it
// is started and replaced, and what it forks.

// preloadedParent returns lang's parent, started or replaced if need be, or
// nil when lang has none, preloading is off, or no parent is wanted yet
// (see server.parentWanted). Called with prestartMu held, in a clean
// sandbox.
func (s *server) preloadedParent(lang language) *preload.Parent {
	if lang.Parent == nil || lang.Prestart == nil || len(s.cfg.preload) == 0 || !s.parentWanted || s.parentFailures >= maxPrestartFailures {
		return nil
	}
	if z := s.parent; z != nil {
		if z.Lang() == lang.Name && z.Alive() && z.Forks() < s.cfg.parentForks {
			return z
		}
		s.dropParent()
	}
	z, err := preload.Start(s.procs, lang.Language, s.cfg.preload, preload.Config{
		UID: s.cfg.uid, GID: s.cfg.gid, Workspace: s.cfg.workspace, Env: s.env(lang),
		ForkTimeout: prestartReadyTimeout, Log: s.cfg.log,
	})
	if err != nil {
		s.parentFailures++
		s.cfg.log.Warn("start preloaded parent", "lang", lang.Name, "failures", s.parentFailures, "error", err)
		return nil
	}
	s.parentFailures = 0
	s.parent = z
	s.procs.SetSparing(true)
	return z
}

// holdsParent reports whether the sandbox holds a preloaded parent.
func (s *server) holdsParent() bool {
	s.prestartMu.Lock()
	defer s.prestartMu.Unlock()
	return s.parent != nil && s.parent.Alive()
}

// dropParent ends the parent, if there is one. Called with prestartMu held.
func (s *server) dropParent() {
	if s.parent == nil {
		return
	}
	s.parent.Kill()
	s.parent = nil
	s.procs.SetSparing(false)
}

// Preloaded returns the modules the parent of lang imported, nil if there
// is none.
func (s *server) preloaded(lang string) []string {
	s.prestartMu.Lock()
	defer s.prestartMu.Unlock()
	if s.parent == nil || s.parent.Lang() != lang {
		return nil
	}
	return s.parent.Modules()
}

// forkKernel forks a session's kernel from lang's preloaded parent, if
// there is one that may still fork (a parent is started or replaced only in
// a clean sandbox, by a Reset), with files as its fds 0-3.
func (s *server) forkKernel(lang language, files []*os.File) (*proc.Proc, bool) {
	s.prestartMu.Lock()
	defer s.prestartMu.Unlock()
	z := s.parent
	if z == nil || z.Lang() != lang.Name || !z.Alive() || z.Forks() >= s.cfg.parentForks || preload.KernelSource(lang.Language) == "" {
		return nil, false
	}
	fs, done, err := s.procs.UserFiles(files)
	if err == nil {
		var p *proc.Proc
		p, err = z.ForkKernel(fs)
		done()
		if err == nil {
			return p, true
		}
	}
	s.cfg.log.Warn("fork kernel from preloaded parent", "lang", lang.Name, "error", err)
	s.dropParent()
	return nil, false
}

// parentAlive says whether lang's parent lives and may fork again. Called
// with prestartMu held.
func (s *server) parentAlive(lang language) bool {
	z := s.parent
	return z != nil && z.Lang() == lang.Name && z.Alive() && z.Forks() < s.cfg.parentForks
}
