package pool

import (
	"context"
	"strings"
	"time"
)

// The sandbox image, rebuilt. agent/host/setup.sh builds it again when its
// recipe changes, and an operator may build or tag another under the same
// name (a library's security fix, say). Each sandbox, and the preloaded
// parent in it, keeps the image it was created from; the pool notices the
// name's new image within the watch loop's interval and replaces the old
// image's sandboxes as they come free: warm ones at once, one at work when
// its run ends (instead of its scrub). A session keeps its sandbox until it
// ends, so that no session loses its state. New sandboxes come from the new
// image, and the first of them reports its interpreters' versions again.

// checkImage resolves the image Spec.Image names now and replaces the
// sandboxes of any other. Called by the watch loop while the engine answers,
// and by open for a sandbox of an image the pool does not know.
func (p *Pool) checkImage(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	id, err := p.cfg.Driver.ImageID(ctx, p.cfg.Spec.Image)
	cancel()
	if err != nil {
		// Gone, or the engine is away: starts will say so, and the
		// sandboxes there are serve on.
		p.NoteError(err)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if id != p.image {
		if p.image != "" {
			p.log.Info("sandbox image changed: replacing the old image's sandboxes as they come free; sessions keep theirs",
				"image", p.cfg.Spec.Image, "old", shortImage(p.image), "new", shortImage(id))
		}
		p.image = id
	}
	kept := p.warm[:0]
	for _, sb := range p.warm {
		if p.staleLocked(sb) {
			p.endLocked(warm)
			p.destroyLocked(sb, destroyImageChanged)
			continue
		}
		kept = append(kept, sb)
	}
	clear(p.warm[len(kept):])
	p.warm = kept
}

// staleLocked reports whether sb comes from an image other than the one
// Spec.Image named when last checked. p.mu is held.
func (p *Pool) staleLocked(sb *Sandbox) bool {
	return p.image != "" && sb.image != "" && sb.image != p.image
}

// shortImage is an image id as `docker images` shows it.
func shortImage(id string) string {
	id = strings.TrimPrefix(id, "sha256:")
	return id[:min(len(id), 12)]
}
