package runner

import (
	"os"
	"slices"

	"github.com/codemode-go/codemode/agent/internal/languages"
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
	if lang.Parent == nil || lang.Prestart == nil || len(s.cfg.preload) == 0 || !s.parentWanted || s.parentFailures >= maxPrestartFailures || s.forkFailures >= maxPrestartFailures {
		return nil
	}
	if z := s.parent; z != nil {
		if z.Lang() == lang.Name && z.Alive() && z.Forks() < s.cfg.parentForks {
			return z
		}
		s.dropParent()
	}
	var light []string
	if s.cfg.lightParent {
		light = languages.LightList(lang.Language, s.cfg.preload)
	}
	z, err := preload.Start(s.procs, lang.Language, s.cfg.preload, light, preload.Config{
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

// parentKind is what a prestarted interpreter is forked from, in the order
// of what a run finds imported in it: nothing (a fresh interpreter), the
// light parent's modules, all the parent's.
type parentKind int8

const (
	noParent parentKind = iota
	lightParent
	mainParent
)

func (k parentKind) String() string {
	return [...]string{"none", "light", "parent"}[k]
}

// wantedParent is what a stateless run of code in lang is best forked from:
// the parent if code names one of its modules, its light parent if code
// names none of the modules only the parent holds and imports nothing that
// the light parent's children would not find (languages.ImportsOnly).
// Called with prestartMu held.
func (s *server) wantedParent(lang language, code string) parentKind {
	if lang.Parent == nil || !languages.NamesModule(code, s.cfg.preload) {
		return noParent
	}
	if l := s.lightOf(lang); l != nil {
		mainOnly := slices.DeleteFunc(slices.Clone(s.cfg.preload), func(m string) bool { return slices.Contains(l.Modules(), m) })
		if !languages.NamesModule(code, mainOnly) && languages.ImportsOnly(code, l.Names()) {
			return lightParent
		}
	}
	return mainParent
}

// lightOf is lang's light parent if it lives, else nil. Called with
// prestartMu held.
func (s *server) lightOf(lang language) *preload.Parent {
	if !s.parentAlive(lang) {
		return nil
	}
	if l := s.parent.Light(); l != nil && l.Alive() {
		return l
	}
	return nil
}

// forkable is what an interpreter for a run that wants want would be
// forked from now: the light parent if it is wanted and lives, else the
// parent if either is wanted and it lives, else nothing. Called with
// prestartMu held.
func (s *server) forkable(lang language, want parentKind) parentKind {
	switch {
	case want == lightParent && s.lightOf(lang) != nil:
		return lightParent
	case want != noParent && s.parentAlive(lang):
		return mainParent
	}
	return noParent
}

// parentLives says whether the parent of kind from, which a prestarted
// interpreter was forked from, lives: the interpreter dies with it.
// Called with prestartMu held.
func (s *server) parentLives(from parentKind) bool {
	switch from {
	case mainParent:
		return s.parent != nil && s.parent.Alive()
	case lightParent:
		return s.parent != nil && s.parent.Light() != nil && s.parent.Light().Alive()
	}
	return true
}
