package execution

import (
	"context"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/singleflight"

	cpv1 "github.com/codemode-go/codemode/gen/codemode/controlplane/v1"
	"github.com/codemode-go/codemode/gen/codemode/controlplane/v1/controlplanev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/limits"
)

// The edge knows no language of its own: it learns the agents' table from
// the control plane and checks requests against it, so that a language added
// to the agents' table is accepted here without any change to the edge.
const (
	// languagesFresh is how long a fetched table is used as it is.
	languagesFresh = 5 * time.Second
	// languagesRetry is the least time between two fetches for a name the
	// table lacks, so that requests naming unknown languages cannot turn
	// into a stream of calls to the control plane.
	languagesRetry = time.Second
)

// languages caches the languages the cluster's agents run. It is safe for
// concurrent use.
type languages struct {
	cp controlplanev1connect.ControlPlaneServiceClient

	mu       sync.Mutex
	list     []*executionv1.Language
	names    map[string]string // name or alias -> name
	defaults *executionv1.Defaults
	fetched  time.Time // zero: never

	calls singleflight.Group // one fetch at a time, shared by its callers
}

// fetch asks the control plane for the table; mu is not held. Callers that
// come while a fetch is under way share its answer, so that the requests
// arriving when the cache turns stale make one call, not one each.
func (l *languages) fetch(ctx context.Context) (*cpv1.ListLanguagesResponse, error) {
	ch := l.calls.DoChan("", func() (any, error) {
		// Not the first caller's context: the others wait on it too.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), languagesFetchTimeout)
		defer cancel()
		return l.fetchNow(ctx)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*cpv1.ListLanguagesResponse), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// languagesFetchTimeout bounds one call for the table.
const languagesFetchTimeout = 5 * time.Second

func (l *languages) fetchNow(ctx context.Context) (*cpv1.ListLanguagesResponse, error) {
	res, err := l.cp.ListLanguages(ctx, connect.NewRequest(&cpv1.ListLanguagesRequest{}))
	if err != nil {
		return nil, err
	}
	list := res.Msg.GetLanguages()
	names := make(map[string]string)
	for _, lang := range list {
		names[lang.GetName()] = lang.GetName()
		for _, a := range lang.GetAliases() {
			if _, ok := names[a]; !ok {
				names[a] = lang.GetName()
			}
		}
	}
	l.mu.Lock()
	l.list, l.names, l.defaults, l.fetched = list, names, res.Msg.GetDefaults(), time.Now()
	l.mu.Unlock()
	return res.Msg, nil
}

// currentDefaults returns the agents' defaults, fetched anew when the cached
// ones are stale; nil when no agent has reported any.
func (l *languages) currentDefaults(ctx context.Context) *executionv1.Defaults {
	l.mu.Lock()
	d, fresh := l.defaults, !l.fetched.IsZero() && time.Since(l.fetched) < languagesFresh
	l.mu.Unlock()
	if fresh && d != nil {
		return d
	}
	if res, err := l.fetch(ctx); err == nil {
		return res.GetDefaults()
	}
	return d
}

// lookup returns the cached table's name for name and whether the cached
// table can answer (it is fresh enough for a name it holds, or was fetched
// within languagesRetry for one it lacks).
func (l *languages) lookup(name string) (canonical string, known, answered bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fetched.IsZero() {
		return "", false, false
	}
	age := time.Since(l.fetched)
	if c, ok := l.names[name]; ok {
		return c, true, age < languagesFresh
	}
	return "", false, age < languagesRetry
}

// canonical returns the name the agents' table gives name (itself, or the
// language it is an alias of), or invalid_argument listing the valid names.
// When the table cannot be had (no agent is ready, the control plane is
// down), name passes unchanged: routing then fails with the reason, and an
// agent checks the language again.
func (l *languages) canonical(ctx context.Context, name string) (string, error) {
	c, known, answered := l.lookup(name)
	if !answered {
		if _, err := l.fetch(ctx); err != nil {
			return name, nil
		}
		c, known, _ = l.lookup(name)
	}
	if known {
		return c, nil
	}
	l.mu.Lock()
	list := l.list
	l.mu.Unlock()
	if len(list) == 0 {
		return name, nil
	}
	return "", connect.NewError(connect.CodeInvalidArgument, limits.UnknownLanguage(name, languageNames(list)))
}

// known reports whether name is a name or alias in the cached table, or
// whether no table has been fetched yet (then nothing can be said).
func (l *languages) known(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.list) == 0 {
		return true
	}
	_, ok := l.names[name]
	return ok
}

func languageNames(list []*executionv1.Language) []string {
	names := make([]string, len(list))
	for i, lang := range list {
		names[i] = lang.GetName()
	}
	return names
}
