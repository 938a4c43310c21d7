package pool

import "sync/atomic"

// preloadDemand says whether a new sandbox starts its preloaded parent
// (see the runner's package preload) with it, or only after its first run
// that names a preloaded module.
//
// A parent costs its sandbox the imports once (seconds of CPU under
// gVisor) and saves them on every run it forks; a sandbox serves at most
// MaxReuse runs. So a new sandbox starts with a parent when one of the
// pool's last MaxReuse stateless runs named a preloaded module, or a
// session was opened since (a session's kernel is forked from the parent):
// then the parent is likely to be used in the new sandbox's life, and the
// run that uses it first is not left to import everything itself. A pool
// whose runs import nothing (print(1) after print(1)) starts no parents,
// and its runs cost what they cost without preloading.
type preloadDemand struct {
	// since counts the stateless runs since the last one that named a
	// preloaded module or the last session; it starts at 0, so the first
	// sandboxes preload.
	since atomic.Int64
}

// noteRun counts a stateless run of language with code.
func (d *preloadDemand) noteRun(names func(language, code string) bool, language, code string) {
	if names == nil {
		return
	}
	if names(language, code) {
		d.since.Store(0)
		return
	}
	d.since.Add(1)
}

// noteSession counts a session opened.
func (d *preloadDemand) noteSession() { d.since.Store(0) }

// wanted reports whether a new sandbox is to start its parent with it.
func (d *preloadDemand) wanted(maxReuse int) bool {
	return d.since.Load() < int64(max(maxReuse, 1))
}
