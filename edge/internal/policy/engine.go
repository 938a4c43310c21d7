package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
)

// Options configure an [Engine].
type Options struct {
	// ConfigPath is the policy configuration file. Empty: no policies, every
	// request is allowed unchanged (Reload and Watch do nothing).
	ConfigPath string
	// CacheDir keeps compiled modules across restarts. Empty: compiled code
	// is cached in memory only, which still makes reloads of unchanged
	// modules cheap.
	CacheDir string
	// KnownLanguage says whether a rewrite may set a language: the edge
	// passes the agents' table (see execution.Service.KnownLanguage). Nil:
	// any name the request rules allow; the agent then checks it.
	KnownLanguage func(name string) bool
	// Logger receives load, reload and failure reports. Default: discard.
	Logger *slog.Logger
	// ContextInterrupt makes every module use wazero's
	// WithCloseOnContextDone for deadlines instead of the interrupt check
	// the engine instruments modules with. It is slower (RATIONALE.md) and
	// is there to compare the two; modules that cannot be instrumented use
	// it anyway.
	ContextInterrupt bool
	// Metrics, if set, count every policy call's decision and time it.
	Metrics *Metrics
	// OnCall, if set, is given a report of every policy call after it
	// ends: its decision, fuel and time. `edge policy run` and `bench` use
	// it; it runs on the evaluation's goroutine, so it must be quick.
	OnCall func(CallReport)
}

// Engine evaluates requests and results against the loaded policies. Create
// it with [New]; it is safe for concurrent use.
type Engine struct {
	opts   Options
	logger *slog.Logger
	cache  wazero.CompilationCache

	current atomic.Pointer[generation]
	nextID  atomic.Uint64

	reloadMu   sync.Mutex // serialises loads
	statusMu   sync.Mutex
	lastErr    error
	lastReload time.Time
	closed     atomic.Bool
}

// generation is one loaded configuration. Evaluations hold a reference;
// the engine holds one while it serves. It closes when the count drops to 0.
type generation struct {
	id        uint64
	loadTime  time.Time
	configSHA string
	cfg       *Config
	request   []*module
	result    []*module
	labels    map[string]map[string]bool // key -> allowed values; nil set: any
	refs      atomic.Int64
	closed    chan struct{}
	shut      bool // the engine is closed: evaluations fail
}

// New makes an engine and loads opts.ConfigPath, failing if it does not load.
func New(ctx context.Context, opts Options) (*Engine, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	e := &Engine{opts: opts, logger: opts.Logger.With("component", "policy")}
	if opts.CacheDir != "" {
		c, err := wazero.NewCompilationCacheWithDir(opts.CacheDir)
		if err != nil {
			return nil, fmt.Errorf("open compilation cache: %w", err)
		}
		e.cache = c
	} else {
		e.cache = wazero.NewCompilationCache()
	}
	g := e.emptyGeneration()
	if opts.ConfigPath != "" {
		var err error
		if g, err = e.load(ctx); err != nil {
			_ = e.cache.Close(ctx)
			return nil, err
		}
	}
	e.current.Store(g)
	e.setStatus(nil)
	return e, nil
}

func (e *Engine) emptyGeneration() *generation {
	g := &generation{loadTime: time.Now(), cfg: &Config{}, closed: make(chan struct{})}
	g.refs.Store(1)
	return g
}

// load builds a generation from the configuration file; on error nothing of
// it is left open.
func (e *Engine) load(ctx context.Context) (*generation, error) {
	raw, err := os.ReadFile(e.opts.ConfigPath)
	if err != nil {
		return nil, fmt.Errorf("read policy config: %w", err)
	}
	return e.build(ctx, raw, nil)
}

// build loads the generation of configuration raw. Policies that are also
// in prev (same name, phase and module digest) keep counting where they
// were.
func (e *Engine) build(ctx context.Context, raw []byte, prev *generation) (_ *generation, err error) {
	cfg, err := ParseConfig(raw)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	g := &generation{
		id:        e.nextID.Add(1),
		configSHA: hex.EncodeToString(sum[:]),
		cfg:       cfg,
		labels:    make(map[string]map[string]bool),
		closed:    make(chan struct{}),
	}
	g.refs.Store(1)
	for k, vs := range cfg.Labels {
		var set map[string]bool
		if len(vs) > 0 {
			set = make(map[string]bool, len(vs))
			for _, v := range vs {
				set[v] = true
			}
		}
		g.labels[k] = set
	}
	defer func() {
		if err != nil {
			g.close(context.WithoutCancel(ctx))
		}
	}()
	dir := filepath.Dir(e.opts.ConfigPath)
	start := time.Now()
	for _, pc := range cfg.Policies {
		m, err := loadModule(ctx, pc, dir, e.cache, e.logger, e.opts.ContextInterrupt)
		if err != nil {
			return nil, fmt.Errorf("load policy %s: %w", pc.Name, err)
		}
		if p := prev.find(m); p != nil {
			// Not serving yet: nothing has counted on m.
			m.counters = p.counters
		}
		m.metrics = e.opts.Metrics.module(pc.Phase, pc.Name)
		if pc.Phase == PhaseRequest {
			g.request = append(g.request, m)
		} else {
			g.result = append(g.result, m)
		}
	}
	byOrder := func(ms []*module) {
		sort.SliceStable(ms, func(i, j int) bool { return ms[i].cfg.Order < ms[j].cfg.Order })
	}
	byOrder(g.request)
	byOrder(g.result)
	g.loadTime = time.Now()
	e.logger.Info("policy generation loaded", "generation", g.id, "policies", len(cfg.Policies),
		"config_sha256", g.configSHA, "duration", time.Since(start))
	return g, nil
}

// find returns g's module that is the same policy as m (name, phase and
// digest), or nil. g may be nil.
func (g *generation) find(m *module) *module {
	if g == nil {
		return nil
	}
	for _, ms := range [][]*module{g.request, g.result} {
		for _, o := range ms {
			if o.cfg.Name == m.cfg.Name && o.cfg.Phase == m.cfg.Phase && o.sha256 == m.sha256 {
				return o
			}
		}
	}
	return nil
}

// acquire returns the serving generation with a reference held.
func (e *Engine) acquire() *generation {
	for {
		g := e.current.Load()
		if n := g.refs.Load(); n > 0 && g.refs.CompareAndSwap(n, n+1) {
			return g
		}
		// g was retired and drained between the load and the CAS; the
		// pointer has moved on, so look again.
	}
}

// release drops a reference; the last one closes the generation.
func (g *generation) release() {
	if g.refs.Add(-1) == 0 {
		go g.close(context.Background())
	}
}

func (g *generation) close(ctx context.Context) {
	for _, m := range g.request {
		m.close(ctx)
	}
	for _, m := range g.result {
		m.close(ctx)
	}
	close(g.closed)
}

// Reload reads the configuration file again. If the file is unchanged it
// does nothing and reports changed=false. Otherwise it builds and warms a new
// generation and swaps it in; the old one closes when its evaluations end. A
// configuration that does not load leaves the old generation serving, and
// its error is returned and kept for [Engine.Status].
func (e *Engine) Reload(ctx context.Context) (changed bool, err error) {
	if e.opts.ConfigPath == "" {
		return false, nil
	}
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	if e.closed.Load() {
		return false, errors.New("policy engine closed")
	}
	raw, err := os.ReadFile(e.opts.ConfigPath)
	if err != nil {
		err = fmt.Errorf("read policy config: %w", err)
		e.setStatus(err)
		e.logger.Error("policy reload failed; previous generation keeps serving", "error", err)
		return false, err
	}
	sum := sha256.Sum256(raw)
	old := e.current.Load()
	if hex.EncodeToString(sum[:]) == old.configSHA {
		e.setStatus(nil)
		return false, nil
	}
	g, err := e.build(ctx, raw, old)
	if err != nil {
		e.setStatus(err)
		e.logger.Error("policy reload failed; previous generation keeps serving",
			"generation", old.id, "error", err)
		return false, err
	}
	// The status first, so that whoever sees the new generation sees its
	// status too, not the error of an earlier reload.
	e.setStatus(nil)
	e.current.Store(g)
	old.release()
	return true, nil
}

// Watch reloads whenever the configuration file's content changes, checking
// every interval, until ctx is done. Reload errors are logged and reported
// by Status; they do not stop the watch.
func (e *Engine) Watch(ctx context.Context, interval time.Duration) {
	if e.opts.ConfigPath == "" {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastFailed [32]byte
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		raw, err := os.ReadFile(e.opts.ConfigPath)
		if err != nil {
			continue // being replaced, perhaps; Reload reports persistent errors
		}
		sum := sha256.Sum256(raw)
		if hex.EncodeToString(sum[:]) == e.current.Load().configSHA || sum == lastFailed {
			continue // unchanged, or the same broken file as last time
		}
		if _, err := e.Reload(ctx); err != nil {
			lastFailed = sum
		}
	}
}

func (e *Engine) setStatus(err error) {
	e.statusMu.Lock()
	e.lastErr, e.lastReload = err, time.Now()
	e.statusMu.Unlock()
}

// Close closes the serving generation once its evaluations end, and the
// compilation cache. Evaluations after Close fail.
func (e *Engine) Close(ctx context.Context) error {
	if !e.closed.CompareAndSwap(false, true) {
		return nil
	}
	e.reloadMu.Lock()
	defer e.reloadMu.Unlock()
	g := e.current.Load()
	// Later evaluations find a generation that refuses them.
	shut := e.emptyGeneration()
	shut.shut = true
	e.current.Store(shut)
	g.release()
	select {
	case <-g.closed:
	case <-ctx.Done():
		return ctx.Err()
	}
	return e.cache.Close(ctx)
}

// Generation returns the id of the serving generation (0: no configuration).
func (e *Engine) Generation() uint64 { return e.current.Load().id }

// HasResultPolicies reports whether the serving generation has result-phase
// policies. A door that streams output must hold it back for them.
func (e *Engine) HasResultPolicies() bool {
	g := e.acquire()
	defer g.release()
	return len(g.result) > 0
}
