package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/codemode-go/codemode/agent/internal/cpuslots"
	"github.com/codemode-go/codemode/agent/internal/sandbox"
	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	"github.com/codemode-go/codemode/internal/testkit"
)

// The pool's logic is tested here against an engine that is not there: a
// fake driver whose containers run a fake runner speaking the real framing.
// The agent's own tests run the same pool against Docker and runsc.

type fakeDriver struct {
	mu       sync.Mutex
	down     bool
	started  int
	live     map[string]*fakeContainer
	removed  []string
	startDur time.Duration
	// gate, if set, holds each start until it receives.
	gate chan struct{}
	// failStarts makes starts fail while the engine answers; attempts
	// counts them.
	failStarts bool
	attempts   atomic.Int64
	// commands are the started containers' commands, in order.
	commands [][]string
	// image is the id of the image the spec's image names ("" for
	// "sha256:one").
	image string
	// ready, if set, holds each runner's Ready until it receives.
	ready chan struct{}
}

var _ sandbox.Driver = (*fakeDriver)(nil)

func newFakeDriver() *fakeDriver { return &fakeDriver{live: map[string]*fakeContainer{}} }

func (d *fakeDriver) setDown(down bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.down = down
}

func (d *fakeDriver) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Container, error) {
	d.mu.Lock()
	if d.down {
		d.mu.Unlock()
		return nil, fmt.Errorf("start: %w", sandbox.ErrUnavailable)
	}
	if d.failStarts {
		d.attempts.Add(1)
		d.mu.Unlock()
		return nil, errors.New("start: no such image")
	}
	d.started++
	d.commands = append(d.commands, spec.Command)
	id := fmt.Sprintf("c%03d", d.started)
	gate := d.gate
	d.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	time.Sleep(d.startDur) // the time a start takes
	d.mu.Lock()
	c := newFakeContainer(id, d.ready)
	c.cpuSet = spec.CPUSet
	c.shares = []int64{spec.CPUShares}
	c.image = d.imageLocked()
	d.mu.Unlock()
	d.mu.Lock()
	d.live[id] = c
	d.mu.Unlock()
	return c, nil
}

func (d *fakeDriver) RemoveAll(ctx context.Context, labels map[string]string, keep map[string]bool) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return 0, sandbox.ErrUnavailable
	}
	n := 0
	for id, c := range d.live {
		if !keep[id] {
			c.kill()
			delete(d.live, id)
			d.removed = append(d.removed, id)
			n++
		}
	}
	return n, nil
}

func (d *fakeDriver) Ping(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return sandbox.ErrUnavailable
	}
	return nil
}

func (d *fakeDriver) ImageID(context.Context, string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return "", sandbox.ErrUnavailable
	}
	return d.imageLocked(), nil
}

func (d *fakeDriver) imageLocked() string {
	if d.image == "" {
		return "sha256:one"
	}
	return d.image
}

// setImage makes the spec's image name another image from now on.
func (d *fakeDriver) setImage(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.image = id
}

func (d *fakeDriver) Close() error { return nil }

func (d *fakeDriver) get(id string) *fakeContainer {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.live[id]
}

// fakeContainer runs a fake runner: Ready, then Run -> Exit and Reset -> Done.
type fakeContainer struct {
	id       string
	inR      *io.PipeReader
	inW      *io.PipeWriter
	outR     *io.PipeReader
	outW     *io.PipeWriter
	done     chan struct{}
	once     sync.Once
	resets   atomic.Int32
	failNext atomic.Bool // the next Reset fails
	cpuSet   string      // of its spec
	image    string      // the id of its image
	ready    chan struct{}

	mu     sync.Mutex
	shares []int64 // its spec's CPU weight, then each SetCPUShares
	// holdReset, if set, holds each Reset until it is closed.
	holdReset chan struct{}
}

func newFakeContainer(id string, ready chan struct{}) *fakeContainer {
	c := &fakeContainer{id: id, done: make(chan struct{}), ready: ready}
	c.inR, c.inW = io.Pipe()
	c.outR, c.outW = io.Pipe()
	go c.serve()
	return c
}

func (c *fakeContainer) serve() {
	defer c.kill()
	if c.ready != nil {
		select {
		case <-c.ready:
		case <-c.done:
			return
		}
	}
	if err := wire.WriteFrame(c.outW, &runnerv1.Event{Kind: &runnerv1.Event_Ready{Ready: &runnerv1.Ready{Versions: map[string]string{"python": "3.fake"}, Prestarted: "python"}}}); err != nil {
		return
	}
	// As the runner does, it prestarts the language of the last run,
	// forked when the run named a preloaded module (here: pandas).
	prestarted, forked := "python", false
	for {
		req := new(runnerv1.Request)
		if err := wire.ReadFrame(c.inR, req); err != nil {
			return
		}
		var ev *runnerv1.Event
		switch k := req.GetKind().(type) {
		case *runnerv1.Request_Run:
			if k.Run.GetCode() == "die" {
				return
			}
			prestarted, forked = k.Run.GetLanguage(), strings.Contains(k.Run.GetCode(), "pandas")
			wire.WriteFrame(c.outW, &runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_Stdout{Stdout: []byte(k.Run.GetCode())}})
			ev = &runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_Exit{Exit: &runnerv1.Exit{}}}
		case *runnerv1.Request_Reset_:
			c.mu.Lock()
			hold := c.holdReset
			c.mu.Unlock()
			if hold != nil {
				select {
				case <-hold:
				case <-c.done:
					return
				}
			}
			c.resets.Add(1)
			if c.failNext.Swap(false) {
				ev = &runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_Error{Error: &runnerv1.Error{Message: "dirty"}}}
			} else {
				ev = &runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_Done{Done: &runnerv1.Done{Prestarted: prestarted, PrestartedForked: forked}}}
			}
		default:
			ev = &runnerv1.Event{Id: req.GetId(), Kind: &runnerv1.Event_Done{Done: &runnerv1.Done{}}}
		}
		if err := wire.WriteFrame(c.outW, ev); err != nil {
			return
		}
	}
}

func (c *fakeContainer) kill() {
	c.once.Do(func() {
		c.inR.CloseWithError(io.EOF)
		c.outW.CloseWithError(io.EOF)
		close(c.done)
	})
}

func (c *fakeContainer) ID() string            { return c.id }
func (c *fakeContainer) Stdin() io.Writer      { return c.inW }
func (c *fakeContainer) Stdout() io.Reader     { return c.outR }
func (c *fakeContainer) Image() string         { return c.image }
func (c *fakeContainer) Done() <-chan struct{} { return c.done }
func (c *fakeContainer) Inspect(context.Context) (sandbox.State, error) {
	select {
	case <-c.done:
		return sandbox.State{ExitCode: 1}, nil
	default:
		return sandbox.State{Running: true}, nil
	}
}
func (c *fakeContainer) Wait(ctx context.Context) (sandbox.State, error) {
	select {
	case <-c.done:
		return sandbox.State{ExitCode: 1}, nil
	case <-ctx.Done():
		return sandbox.State{}, ctx.Err()
	}
}
func (c *fakeContainer) Remove(context.Context) error { c.kill(); return nil }

func (c *fakeContainer) SetCPUShares(_ context.Context, shares int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.shares = append(c.shares, shares)
	return nil
}

// weights returns its CPU weights so far: its spec's, then each set.
func (c *fakeContainer) weights() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.shares)
}

func newTestPool(t *testing.T, d *fakeDriver, edit func(*Config)) *Pool {
	t.Helper()
	cfg := Config{
		Driver: d, MinWarm: 1, Max: 2, MaxReuse: 3,
		Labels: map[string]string{sandbox.LabelAgent: "fake"},
		Spec: sandbox.Spec{Image: "img", Runtime: "runsc", Command: []string{"/runner"}, User: "0:0",
			MemoryBytes: 256 << 20, NanoCPUs: 1e9, PidsLimit: 256},
	}
	if edit != nil {
		edit(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.Start(t.Context())
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

func run(t *testing.T, sb *Sandbox, code string) error {
	t.Helper()
	_, err := sb.Run(t.Context(), &runnerv1.Run{Language: "python", Code: code}, nil, nil)
	return err
}

func TestPoolRecyclesBoundedTimes(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	m := NewMetrics()
	p := newTestPool(t, d, func(c *Config) { c.Max, c.Metrics = 1, m })
	testkit.WaitFor(t, 10*time.Second, "a warm sandbox", func() bool { return p.Stats().Warm == 1 })
	var ids []string
	for range 4 {
		sb, err := p.Acquire(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := run(t, sb, "x"); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID())
		p.Release(t.Context(), sb, true)
	}
	// MaxReuse 3: three runs in the first sandbox (scrubbed between them),
	// the fourth in a new one.
	if ids[0] != ids[1] || ids[1] != ids[2] || ids[3] == ids[2] {
		t.Errorf("sandboxes used: %v", ids)
	}
	// Removal runs beside the rest (destroyLocked).
	testkit.WaitFor(t, 10*time.Second, "the worn-out sandbox removed", func() bool {
		got := d.get("c001")
		return got == nil || isDone(got)
	})
	// The first and the fourth run took a new sandbox (warm, or started
	// for the run if the pool had not started one yet), the second and
	// the third the first one scrubbed; all but the third were scrubbed.
	testkit.WaitFor(t, 10*time.Second, "three scrubs", func() bool { return counted(t, m.scrubs, "ok") == 3 })
	for _, c := range []struct {
		name string
		got  float64
		want float64
	}{
		{"new sandboxes taken", counted(t, m.takes, takeWarm) + counted(t, m.takes, takeCold), 2},
		{"reused sandboxes taken", counted(t, m.takes, takeReused), 2},
		{"destroyed after MaxReuse", counted(t, m.destroyed, destroyMaxReuse), 1},
		{"destroyed", counted(t, m.destroyed), 1},
		{"failed scrubs", counted(t, m.scrubs, "error"), 0},
		{"started", counted(t, m.starts, "warm", "ok") + counted(t, m.starts, "run", "ok"), 2},
	} {
		if c.got != c.want {
			t.Errorf("%s: %v, want %v", c.name, c.got, c.want)
		}
	}
}

// A new sandbox starts its preloaded parent with it while one of the
// pool's last MaxReuse stateless runs named a preloaded module, or a
// session was opened since; otherwise its runner starts the parent only
// when a run wants it.
func TestPoolPreloadDemand(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	p := newTestPool(t, d, func(c *Config) {
		c.Max = 1
		c.NamesPreloaded = func(language, code string) bool { return language == "python" && code == "import numpy" }
	})
	lazy := func(i int) bool {
		t.Helper()
		d.mu.Lock()
		defer d.mu.Unlock()
		if i >= len(d.commands) {
			t.Fatalf("sandbox %d not started; commands %q", i, d.commands)
		}
		return slices.Contains(d.commands[i], "-preload-start=false")
	}
	runs := func(codes ...string) {
		t.Helper()
		testkit.WaitFor(t, 10*time.Second, "a warm sandbox", func() bool { return p.Stats().Warm == 1 })
		sb, err := p.Acquire(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, code := range codes {
			if err := run(t, sb, code); err != nil {
				t.Fatal(err)
			}
		}
		p.Release(t.Context(), sb, true) // MaxReuse 3: destroyed
	}
	for i, tc := range []struct {
		codes []string
		lazy  bool // the sandbox started after these runs
	}{
		{[]string{"x", "x", "x"}, true},             // three in a row named none
		{[]string{"import numpy", "x", "x"}, false}, // one of the last three did
		{[]string{"x", "x", "x"}, true},             // none again
		{[]string{"import numpy", "x", "import numpy"}, false},
	} {
		runs(tc.codes...)
		if i == 0 && lazy(0) {
			t.Errorf("the first sandbox starts without its parent")
		}
		testkit.WaitFor(t, 10*time.Second, "a new sandbox", func() bool {
			d.mu.Lock()
			defer d.mu.Unlock()
			return len(d.commands) > i+1
		})
		if got := lazy(i + 1); got != tc.lazy {
			t.Errorf("after runs %q: new sandbox lazy %v, want %v", tc.codes, got, tc.lazy)
		}
	}
	// A session counts as a run that names a preloaded module.
	runs("x", "x", "x")
	testkit.WaitFor(t, 10*time.Second, "a warm sandbox", func() bool { return p.Stats().Warm == 1 })
	sb, err := p.Hold(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	p.Drop(sb)
	testkit.WaitFor(t, 10*time.Second, "a new sandbox", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.commands) > 6
	})
	if lazy(6) {
		t.Errorf("the sandbox started after a session starts without its parent")
	}
}

// A run takes a warm sandbox whose runner has its language prestarted, if
// one has, before the most recently used one.
func TestPoolPrefersPrestartedLanguage(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	p := newTestPool(t, d, func(c *Config) { c.MinWarm, c.Max = 2, 2 })
	testkit.WaitFor(t, 10*time.Second, "two warm sandboxes", func() bool { return p.Stats().Warm == 2 })
	used := map[string]string{} // language -> sandbox id
	for _, lang := range []string{"javascript", "python"} {
		sb, err := p.AcquireFor(t.Context(), 0, lang, "x")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Run(t.Context(), &runnerv1.Run{Language: lang, Code: "x"}, nil, nil); err != nil {
			t.Fatal(err)
		}
		used[lang] = sb.ID()
		p.Release(t.Context(), sb, true) // scrubbed: it prestarts lang
	}
	testkit.WaitFor(t, 10*time.Second, "both back", func() bool { return p.Stats().Warm == 2 })
	// python's sandbox came back last; javascript's is still preferred for
	// javascript, and each language finds its own.
	for _, lang := range []string{"javascript", "python", "javascript"} {
		sb, err := p.AcquireFor(t.Context(), 0, lang, "x")
		if err != nil {
			t.Fatal(err)
		}
		if sb.ID() != used[lang] || sb.Prestarted().Language != lang {
			t.Errorf("a %s run took %s (prestarted %+v), want %s", lang, sb.ID(), sb.Prestarted(), used[lang])
		}
		p.Release(t.Context(), sb, true) // scrubbed without a run: still prestarted
		testkit.WaitFor(t, 10*time.Second, "it back", func() bool { return p.Stats().Warm == 2 })
	}
}

// A run that names a preloaded module takes a warm sandbox whose runner has
// an interpreter forked from the parent prestarted, and one that names none
// a sandbox with a fresh interpreter, whichever came back last.
func TestPoolPrefersPrestartedKind(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	p := newTestPool(t, d, func(c *Config) {
		c.MinWarm, c.Max = 2, 2
		c.NamesPreloaded = func(_, code string) bool { return strings.Contains(code, "pandas") }
	})
	testkit.WaitFor(t, 10*time.Second, "two warm sandboxes", func() bool { return p.Stats().Warm == 2 })
	used := map[string]string{} // code -> sandbox id
	for _, code := range []string{"import pandas", "print(1)"} {
		sb, err := p.AcquireFor(t.Context(), 0, "python", code)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sb.Run(t.Context(), &runnerv1.Run{Language: "python", Code: code}, nil, nil); err != nil {
			t.Fatal(err)
		}
		used[code] = sb.ID()
		p.Release(t.Context(), sb, true)
		testkit.WaitFor(t, 10*time.Second, "it back", func() bool { return p.Stats().Warm == 2 })
	}
	if used["import pandas"] == used["print(1)"] {
		t.Fatal("both runs took one sandbox")
	}
	for _, code := range []string{"import pandas; pandas.DataFrame()", "print(2)", "print(3)", "import pandas"} {
		sb, err := p.AcquireFor(t.Context(), 0, "python", code)
		if err != nil {
			t.Fatal(err)
		}
		want := used["print(1)"]
		if strings.Contains(code, "pandas") {
			want = used["import pandas"]
		}
		if sb.ID() != want {
			t.Errorf("%q took %s (prestarted %+v), want %s", code, sb.ID(), sb.Prestarted(), want)
		}
		p.Release(t.Context(), sb, true) // scrubbed without a run: as it was
		testkit.WaitFor(t, 10*time.Second, "it back", func() bool { return p.Stats().Warm == 2 })
	}
}

// Sandboxes are spread evenly over the CPU sets, also as they are replaced,
// and a run takes a warm sandbox on the set with the least work under way
// before the most recently used one.
func TestPoolSpreadsOverCPUSets(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	p := newTestPool(t, d, func(c *Config) {
		c.MinWarm, c.Max, c.CPUSets = 4, 4, []string{"0", "1"}
		c.measureSet = func(string) (time.Duration, error) { return 5 * time.Millisecond, nil } // an even host
	})
	testkit.WaitFor(t, 10*time.Second, "four warm sandboxes", func() bool { return p.Stats().Warm == 4 })
	set := func(sb *Sandbox) string { return d.get(sb.ID()).cpuSet }
	even := func(when string) {
		t.Helper()
		per := map[string]int{}
		d.mu.Lock()
		for _, c := range d.live {
			if !isDone(c) {
				per[c.cpuSet]++
			}
		}
		d.mu.Unlock()
		if per["0"] != 2 || per["1"] != 2 {
			t.Fatalf("%s: sandboxes per CPU set: %v, want 2 on each", when, per)
		}
	}
	even("warm")

	// Take all four, and give them back so that the two most recently
	// used are on one set.
	bySet := map[string][]*Sandbox{}
	for range 4 {
		sb, err := p.Acquire(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		bySet[set(sb)] = append(bySet[set(sb)], sb)
	}
	if len(bySet["0"]) != 2 || len(bySet["1"]) != 2 {
		t.Fatalf("four runs at once took sandboxes on CPU sets %v", bySet)
	}
	for i, sb := range []*Sandbox{bySet["1"][0], bySet["1"][1], bySet["0"][0], bySet["0"][1]} {
		p.Release(t.Context(), sb, true)
		testkit.WaitFor(t, 10*time.Second, "it back", func() bool { return p.Stats().Warm == i+1 })
	}
	first, err := p.Acquire(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	second, err := p.Acquire(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if first.ID() != bySet["0"][1].ID() || set(second) != "1" {
		t.Errorf("two runs took sandboxes on CPU sets %s and %s, want the most recently used (on 0), then one on 1", set(first), set(second))
	}
	p.Release(t.Context(), first, true)
	p.Release(t.Context(), second, true)

	// A session's sandbox is destroyed when it ends; its replacement goes
	// to the set that lost it.
	session, err := p.Hold(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	p.Drop(session)
	testkit.WaitFor(t, 10*time.Second, "four warm sandboxes", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		n := 0
		for _, c := range d.live {
			if !isDone(c) {
				n++
			}
		}
		return p.Stats().Warm == 4 && n == 4
	})
	even("after a session ended")
}

// Among warm sandboxes on CPU sets with as little work under way, a run
// takes one on a set that is not slow before the most recently used; a
// set's work still comes first. The speeds are given: a slow virtual CPU
// is the hypervisor's, not something a test can make (cpuset's TestSpeed
// measures real ones).
func TestPoolFavoursFastCPUSets(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	m := NewMetrics()
	var mu sync.Mutex
	speed := map[string]time.Duration{"0": 8 * time.Millisecond, "1": 5 * time.Millisecond}
	p := newTestPool(t, d, func(c *Config) {
		c.MinWarm, c.Max, c.CPUSets, c.Metrics = 2, 2, []string{"0", "1"}, m
		c.measureSet = func(set string) (time.Duration, error) {
			mu.Lock()
			defer mu.Unlock()
			return speed[set], nil
		}
	})
	testkit.WaitFor(t, 10*time.Second, "two warm sandboxes", func() bool { return p.Stats().Warm == 2 })
	slow := func(lane int) bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.slowLocked(lane)
	}
	testkit.WaitFor(t, 10*time.Second, "set 0 measured slow", func() bool { return slow(0) && !slow(1) })
	set := func(sb *Sandbox) string { return d.get(sb.ID()).cpuSet }

	// Given back so that the most recently used is on the slow set.
	a, _ := p.Acquire(t.Context(), 0)
	b, _ := p.Acquire(t.Context(), 0)
	if set(a) == "0" {
		a, b = b, a
	}
	p.Release(t.Context(), a, true)
	testkit.WaitFor(t, 10*time.Second, "it back", func() bool { return p.Stats().Warm == 1 })
	p.Release(t.Context(), b, true)
	testkit.WaitFor(t, 10*time.Second, "it back", func() bool { return p.Stats().Warm == 2 })

	first, err := p.Acquire(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if set(first) != "1" {
		t.Errorf("an idle host's run took a sandbox on CPU set %s, want the fast set 1", set(first))
	}
	// Set 1 has work under way now: the next run goes to the slow set.
	second, err := p.Acquire(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if set(second) != "0" {
		t.Errorf("with set 1 at work, a run took a sandbox on CPU set %s, want 0", set(second))
	}
	p.Release(t.Context(), first, true)
	p.Release(t.Context(), second, true)
	testkit.WaitFor(t, 10*time.Second, "both back", func() bool { return p.Stats().Warm == 2 })

	// Measured again while runs come (at most every speedEvery), within
	// slowerBy of each other: neither is slow.
	mu.Lock()
	speed["0"] = 5200 * time.Microsecond
	mu.Unlock()
	testkit.WaitFor(t, 10*time.Second, "set 0 measured again, not slow", func() bool { return !slow(0) && !slow(1) })
	var g dto.Metric
	if err := m.setSpeed.WithLabelValues("0").Write(&g); err != nil || g.GetGauge().GetValue() != 0.0052 {
		t.Errorf("codemode_agent_cpu_set_speed_seconds{set=0} = %v (%v), want 0.0052", g.GetGauge().GetValue(), err)
	}
}

// A sandbox started while its CPU sets hold as many each goes to the
// first of them, slow or not: a slow spell at its start says little about
// its life, and agents alike on one host then lay their sandboxes out
// alike (see laneLocked).
func TestPoolStartsTiesOnFirstCPUSet(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	p := newTestPool(t, d, func(c *Config) {
		c.MinWarm, c.Max, c.CPUSets = 2, 3, []string{"0", "1"}
		c.measureSet = func(set string) (time.Duration, error) {
			if set == "0" {
				return 8 * time.Millisecond, nil
			}
			return 5 * time.Millisecond, nil
		}
	})
	testkit.WaitFor(t, 10*time.Second, "two warm sandboxes", func() bool { return p.Stats().Warm == 2 })
	testkit.WaitFor(t, 10*time.Second, "set 0 measured slow", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.slowLocked(0)
	})
	// One at work: the pool starts a third to keep two warm, with one
	// sandbox on each set.
	sb, err := p.Acquire(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Release(t.Context(), sb, true)
	testkit.WaitFor(t, 10*time.Second, "a third sandbox", func() bool { return p.Stats().Warm == 2 })
	count := map[string]int{}
	d.mu.Lock()
	for _, c := range d.live {
		count[c.cpuSet]++
	}
	d.mu.Unlock()
	if count["0"] != 2 || count["1"] != 1 {
		t.Errorf("sandboxes per CPU set %v, want 2 on set 0 and 1 on set 1", count)
	}
}

func TestPoolDestroysOnAbnormal(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	m := NewMetrics()
	p := newTestPool(t, d, func(c *Config) { c.Metrics = m })
	testkit.WaitFor(t, 10*time.Second, "a warm sandbox", func() bool { return p.Stats().Warm == 1 })

	// Not reusable: destroyed, not scrubbed.
	sb, _ := p.Acquire(t.Context(), 0)
	c := d.get(sb.ID())
	p.Release(t.Context(), sb, false)
	if c.resets.Load() != 0 {
		t.Error("an abnormal sandbox was scrubbed for reuse")
	}
	testkit.WaitFor(t, 10*time.Second, "its removal", func() bool { return isDone(c) })

	// A failed scrub destroys the sandbox.
	testkit.WaitFor(t, 10*time.Second, "a warm sandbox", func() bool { return p.Stats().Warm >= 1 })
	sb, _ = p.Acquire(t.Context(), 0)
	c = d.get(sb.ID())
	c.failNext.Store(true)
	p.Release(t.Context(), sb, true)
	testkit.WaitFor(t, 10*time.Second, "the dirty sandbox destroyed", func() bool { return isDone(c) })
	if st := p.Stats(); st.Busy != 0 || st.Recycling != 0 {
		t.Errorf("stats after: %+v", st)
	}
	if n, f, all := counted(t, m.destroyed, destroyNotReusable), counted(t, m.destroyed, destroyScrubFailed), counted(t, m.destroyed); n != 1 || f != 1 || all != 2 {
		t.Errorf("destroyed %v not reusable and %v whose scrub failed, %v in all; want 1, 1, 2", n, f, all)
	}
	if got := counted(t, m.scrubs, "error"); got != 1 {
		t.Errorf("failed scrubs: %v, want 1", got)
	}
	// Closing destroys what is left (the warm sandbox that replaced the
	// destroyed ones), and every sandbox started is counted destroyed once.
	testkit.WaitFor(t, 10*time.Second, "the pool refilled", func() bool { st := p.Stats(); return st.Warm == 1 && st.Starting == 0 })
	if err := p.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	started := counted(t, m.starts, "warm", "ok") + counted(t, m.starts, "run", "ok")
	if destroyed := counted(t, m.destroyed); destroyed != started || counted(t, m.destroyed, destroyPoolClosed) < 1 {
		t.Errorf("started %v, destroyed %v (%v on close); want all destroyed, some on close", started, destroyed, counted(t, m.destroyed, destroyPoolClosed))
	}
}

// counted returns the sum of the series of v whose first labels are
// values.
func counted(t *testing.T, v *prometheus.CounterVec, values ...string) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	v.Collect(ch)
	close(ch)
	var sum float64
next:
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatal(err)
		}
		for i, want := range values {
			if pb.GetLabel()[i].GetValue() != want {
				continue next
			}
		}
		sum += pb.GetCounter().GetValue()
	}
	return sum
}

// acquireWaiting calls p.Acquire with ctx in the background and waits
// until it is the one caller in line (what says so in a failure); its
// sandbox comes on the channel, nil if it failed (an error of t).
func acquireWaiting(t *testing.T, ctx context.Context, p *Pool, what string) <-chan *Sandbox {
	t.Helper()
	got := make(chan *Sandbox, 1)
	go func() {
		sb, err := p.Acquire(ctx, 0)
		if err != nil {
			t.Error(err)
		}
		got <- sb
	}()
	testkit.WaitFor(t, 10*time.Second, what, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.waiting == 1
	})
	return got
}

func isDone(c *fakeContainer) bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func TestPoolWaitsAtCapacity(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	p := newTestPool(t, d, func(c *Config) { c.Max = 2; c.MinWarm = 2 })
	testkit.WaitFor(t, 10*time.Second, "two warm sandboxes", func() bool { return p.Stats().Warm == 2 })
	a, _ := p.Acquire(t.Context(), 0)
	b, _ := p.Acquire(t.Context(), 0)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := p.Acquire(ctx, 0); !errors.Is(err, ErrExhausted) {
		t.Errorf("third Acquire at capacity: %v, want ErrExhausted", err)
	}
	got := acquireWaiting(t, context.Background(), p, "the third Acquire to wait")
	p.Release(t.Context(), a, true)
	select {
	case sb := <-got:
		if sb.ID() != a.ID() {
			t.Errorf("waiter got %s, want the scrubbed %s", sb.ID(), a.ID())
		}
		p.Release(t.Context(), sb, true)
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not served after a release")
	}
	p.Release(t.Context(), b, true)
	d.mu.Lock()
	if d.started != 2 {
		t.Errorf("started %d sandboxes, want 2", d.started)
	}
	d.mu.Unlock()
}

func TestPoolEngineAway(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	p := newTestPool(t, d, nil)
	testkit.WaitFor(t, 10*time.Second, "a warm sandbox", func() bool { return p.Stats().Warm == 1 })
	d.setDown(true)
	p.NoteError(sandbox.ErrUnavailable)
	testkit.WaitFor(t, 10*time.Second, "not ready", func() bool { return !p.Stats().Ready })
	if _, err := p.Acquire(t.Context(), 0); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("Acquire with the engine away: %v", err)
	}
	d.setDown(false)
	testkit.WaitFor(t, 10*time.Second, "ready and warm again", func() bool { st := p.Stats(); return st.Ready && st.Warm == 1 })
	// The sandbox lost track of while away was removed on reconnecting.
	d.mu.Lock()
	if len(d.removed) == 0 {
		t.Error("nothing reaped on reconnecting")
	}
	d.mu.Unlock()
	sb, err := p.Acquire(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t, sb, "ok"); err != nil {
		t.Error(err)
	}
	p.Release(t.Context(), sb, true)
}

// TestPoolWarmed: the pool says it has warmed once it has its MinWarm warm
// sandboxes, again after the engine comes back, and once starts have
// failed three times in a row (runs would meet the same error).
func TestPoolWarmed(t *testing.T) {
	t.Parallel()
	t.Run("starts", func(t *testing.T) {
		t.Parallel()
		d := newFakeDriver()
		d.gate = make(chan struct{})
		p := newTestPool(t, d, func(c *Config) { c.MinWarm, c.Max = 2, 3 })
		if st := p.Stats(); !st.Ready || st.Warmed {
			t.Fatalf("before any start: ready %v, warmed %v; want ready, not warmed", st.Ready, st.Warmed)
		}
		d.gate <- struct{}{}
		testkit.WaitFor(t, 10*time.Second, "one warm sandbox", func() bool { return p.Stats().Warm == 1 })
		if p.Stats().Warmed {
			t.Fatal("warmed with 1 of 2 warm sandboxes")
		}
		d.gate <- struct{}{}
		testkit.WaitFor(t, 10*time.Second, "warmed", func() bool { return p.Stats().Warmed })
		close(d.gate)
		d.setDown(true)
		p.NoteError(sandbox.ErrUnavailable)
		testkit.WaitFor(t, 10*time.Second, "not ready", func() bool { return !p.Stats().Ready })
		if p.Stats().Warmed {
			t.Fatal("warmed with the engine away")
		}
		d.setDown(false)
		testkit.WaitFor(t, 10*time.Second, "warmed again", func() bool { st := p.Stats(); return st.Ready && st.Warmed && st.Warm >= 2 })
	})
	t.Run("failed start", func(t *testing.T) {
		t.Parallel()
		d := newFakeDriver()
		d.failStarts = true
		p := newTestPool(t, d, nil)
		testkit.WaitFor(t, 10*time.Second, "warmed", func() bool { return p.Stats().Warmed })
		if st := p.Stats(); !st.Ready || st.Warm != 0 {
			t.Fatalf("ready %v with %d warm, want ready with none", st.Ready, st.Warm)
		}
		if n := d.attempts.Load(); n < startFailuresWarmed {
			t.Fatalf("warmed after %d failed starts, want %d", n, startFailuresWarmed)
		}
	})
}

func TestPoolReplacesDeadWarmSandbox(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	p := newTestPool(t, d, nil)
	testkit.WaitFor(t, 10*time.Second, "a warm sandbox", func() bool { return p.Stats().Warm == 1 })
	d.mu.Lock()
	for _, c := range d.live {
		c.kill()
	}
	d.mu.Unlock()
	sb, err := p.Acquire(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := run(t, sb, "ok"); err != nil {
		t.Errorf("run in the replacement: %v", err)
	}
	p.Release(t.Context(), sb, true)
}

func TestSessions(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	m := NewMetrics()
	p := newTestPool(t, d, func(c *Config) { c.Max, c.Metrics = 3, m })
	s := NewSessions(p, SessionsConfig{Max: 2, IdleTTL: 200 * time.Millisecond, MaxIdleTTL: 2 * time.Hour})
	t.Cleanup(s.CloseAll)
	ctx := t.Context()
	if _, err := s.Create(ctx, "a", "t1", "python", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "a", "t1", "python", 0); !errors.Is(err, ErrSessionExists) {
		t.Errorf("duplicate: %v", err)
	}
	// Another tenant finds no session "a", and cannot open one.
	otherTenantFindsNone(t, ctx, s)
	// Without allowNew, an id that never existed is not opened.
	if _, err := s.Use(ctx, "new", "t1", "python", 0, false, func(*Sandbox) (bool, error) { return false, nil }); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("Use without allowNew: %v", err)
	}
	// Use opens an unknown session, which cannot idle out while in use;
	// then it idles out.
	if _, err := s.Use(ctx, "b", "t1", "python", 0, true, func(sb *Sandbox) (bool, error) {
		if _, err := s.Create(ctx, "c", "t1", "python", 0); !errors.Is(err, ErrTooManySessions) {
			t.Errorf("third session: %v", err)
		}
		return false, run(t, sb, "x")
	}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "session b idled out", func() bool { return s.Len() == 1 })
	var ended *EndedError
	if err := s.With(ctx, "b", "t1", func(*Sandbox) error { return nil }); !errors.As(err, &ended) || ended.Reason != EndExpired {
		t.Errorf("With on an expired session: %v", err)
	}
	// An id that existed is never opened again, even when allowed.
	if _, err := s.Use(ctx, "b", "t1", "python", 0, true, func(*Sandbox) (bool, error) { return false, nil }); !errors.As(err, &ended) || ended.Reason != EndExpired {
		t.Errorf("Use of an expired session: %v", err)
	}
	if _, err := s.Create(ctx, "b", "t1", "python", 0); !errors.Is(err, ErrSessionExists) {
		t.Errorf("Create with an ended session's id: %v", err)
	}
	// Another tenant is not told that it ended.
	if _, err := s.Info("b", "t2"); errors.As(err, &ended) || !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("Info of another tenant's ended session: %v", err)
	}
	// A session whose sandbox dies is closed, and lost.
	_, err := s.Use(ctx, "a", "t1", "python", 0, false, func(sb *Sandbox) (bool, error) {
		err := run(t, sb, "die")
		return errors.Is(err, wire.ErrRunnerGone), err
	})
	if !errors.Is(err, wire.ErrRunnerGone) || s.Len() != 0 {
		t.Errorf("run that killed the sandbox: %v, %d sessions", err, s.Len())
	}
	if _, err := s.Info("a", "t1"); !errors.As(err, &ended) || ended.Reason != EndLost {
		t.Errorf("Info of a lost session: %v", err)
	}
	// A closed session says so.
	if _, err := s.Create(ctx, "d", "t1", "python", 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Close("d", "t1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close("d", "t1"); !errors.As(err, &ended) || ended.Reason != EndClosed {
		t.Errorf("second Close: %v", err)
	}
	if st := p.Stats(); st.Held != 0 {
		t.Errorf("held sandboxes after sessions closed: %+v", st)
	}
	// Three sessions opened (a, b, d): b expired, a was lost, d closed.
	checkSessionMetrics(t, m)
}

// otherTenantFindsNone checks that tenant t2 finds no session "a" of t1's and
// cannot use, open or close it.
func otherTenantFindsNone(t *testing.T, ctx context.Context, s *Sessions) {
	if _, err := s.Info("a", "t2"); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("Info of another tenant's session: %v", err)
	}
	if err := s.With(ctx, "a", "t2", func(*Sandbox) error { return nil }); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("With on another tenant's session: %v", err)
	}
	if _, err := s.Use(ctx, "a", "t2", "python", 0, true, func(*Sandbox) (bool, error) { return false, nil }); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("Use of another tenant's session: %v", err)
	}
	if err := s.Close("a", "t2"); !errors.Is(err, ErrSessionNotFound) {
		t.Errorf("Close of another tenant's session: %v", err)
	}
}

// checkSessionMetrics checks TestSessions' metrics: three sessions opened,
// one ended by each reason, and their three sandboxes destroyed as they ended.
func checkSessionMetrics(t *testing.T, m *Metrics) {
	if got := testkit.Written(t, m.sessionsOpened).GetCounter().GetValue(); got != 3 {
		t.Errorf("sessions opened: %v, want 3", got)
	}
	for _, r := range []EndReason{EndClosed, EndExpired, EndLost} {
		if got := counted(t, m.sessionsClosed, r.String()); got != 1 {
			t.Errorf("sessions %s: %v, want 1", r, got)
		}
	}
	if got := counted(t, m.destroyed, destroySessionEnded); got != 3 {
		t.Errorf("sandboxes destroyed as their session ended: %v, want 3", got)
	}
}

// TestJournal checks that sessions ended, and sessions open when the agent
// stopped, are known after a restart: as closed, expired or lost, for their
// tenant only; and that a line cut short by a crash is skipped.
func TestJournal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d := newFakeDriver()
	p := newTestPool(t, d, func(c *Config) { c.Max = 3 })
	ctx := t.Context()

	j, err := OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := NewSessions(p, SessionsConfig{Max: 3, IdleTTL: time.Hour, MaxIdleTTL: time.Hour, Journal: j})
	for _, id := range []string{"closed", "open"} {
		if _, err := s.Create(ctx, id, "t1", "python", 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close("closed", "t1"); err != nil {
		t.Fatal(err)
	}
	// The agent is killed: its sessions are never closed, the journal is
	// left as it is, with a torn last line.
	s.stop()
	<-s.done
	j.Close()
	f, err := os.OpenFile(filepath.Join(dir, "sessions.jsonl"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"op":"open","id":"torn`)
	f.Close()

	j2, err := OpenJournal(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j2.Close() })
	if n := j2.Lost(); n != 1 {
		t.Errorf("Lost() = %d, want 1", n)
	}
	s2 := NewSessions(p, SessionsConfig{Max: 3, IdleTTL: time.Hour, MaxIdleTTL: time.Hour, Journal: j2})
	t.Cleanup(s2.CloseAll)
	var ended *EndedError
	for id, want := range map[string]EndReason{"closed": EndClosed, "open": EndLost} {
		if _, err := s2.Use(ctx, id, "t1", "python", 0, true, func(*Sandbox) (bool, error) { return false, nil }); !errors.As(err, &ended) || ended.Reason != want {
			t.Errorf("%s after restart: %v, want %v", id, err, want)
		}
		if _, err := s2.Info(id, "t2"); errors.As(err, &ended) || !errors.Is(err, ErrSessionNotFound) {
			t.Errorf("%s for another tenant: %v, want plain not found", id, err)
		}
	}
	if _, err := s2.Use(ctx, "torn", "t1", "python", 0, true, func(*Sandbox) (bool, error) { return false, nil }); err != nil {
		t.Errorf("an id only a torn line names: %v, want a new session", err)
	}
}

// TestTransitions pins the pool's state machine: each state's exits, and
// that the counts come back to zero after every path a sandbox can take.
func TestTransitions(t *testing.T) {
	want := map[[2]state]bool{
		{starting, warm}: true, {direct, busy}: true, {warm, busy}: true,
		{busy, recycling}: true, {busy, held}: true, {recycling, warm}: true,
	}
	for from := state(0); from < numStates; from++ {
		for to := state(0); to < numStates; to++ {
			if got := canMove(from, to); got != want[[2]state{from, to}] {
				t.Errorf("canMove(%v, %v) = %v", from, to, got)
			}
		}
	}
	p := &Pool{changed: make(chan struct{})}
	sb := &Sandbox{}
	// A stateless run's sandbox: started warm, taken, scrubbed, taken by a
	// session, ended.
	p.enterLocked(starting)
	p.warm = append(p.warm, sb)
	p.moveLocked(starting, warm)
	if p.totalLocked() != 1 || p.incomingLocked() != 0 {
		t.Fatalf("warm: total %d, incoming %d", p.totalLocked(), p.incomingLocked())
	}
	p.warm = p.warm[:0]
	p.moveLocked(warm, busy)
	p.moveLocked(busy, recycling)
	if p.incomingLocked() != 1 {
		t.Fatalf("recycling: incoming %d, want 1", p.incomingLocked())
	}
	p.warm = append(p.warm, sb)
	p.moveLocked(recycling, warm)
	p.warm = p.warm[:0]
	p.moveLocked(warm, busy)
	p.moveLocked(busy, held)
	p.endLocked(held)
	// One started for a caller, destroyed after its run.
	p.enterLocked(direct)
	p.moveLocked(direct, busy)
	p.endLocked(busy)
	if p.totalLocked() != 0 || p.n != [numStates]int{} {
		t.Fatalf("after every path: total %d, counts %v", p.totalLocked(), p.n)
	}
	defer func() {
		if recover() == nil {
			t.Error("moving from held back to warm did not panic")
		}
	}()
	p.moveLocked(held, warm)
}

// TestSessionsPerTenant: a tenant at its limit of open sessions is refused
// a new one, by Create and by a run that would open one, saying so; other
// tenants still open sessions, and the tenant may again once one closes.
func TestSessionsPerTenant(t *testing.T) {
	t.Parallel()
	p := newTestPool(t, newFakeDriver(), func(c *Config) { c.Max = 5 })
	s := NewSessions(p, SessionsConfig{Max: 4, MaxPerTenant: 2, IdleTTL: time.Hour, MaxIdleTTL: time.Hour})
	t.Cleanup(s.CloseAll)
	ctx := t.Context()
	for _, id := range []string{"a1", "a2"} {
		if _, err := s.Create(ctx, id, "team-a", "python", 0); err != nil {
			t.Fatal(err)
		}
	}
	var limit *TenantLimitError
	if _, err := s.Create(ctx, "a3", "team-a", "python", 0); !errors.As(err, &limit) || limit.Open != 2 || !errors.Is(err, ErrTooManySessions) {
		t.Errorf("third session of one tenant: %v, want a TenantLimitError of 2", err)
	}
	if _, err := s.Use(ctx, "a3", "team-a", "python", 0, true, func(*Sandbox) (bool, error) { return false, nil }); !errors.As(err, &limit) {
		t.Errorf("run opening a third session of one tenant: %v, want a TenantLimitError", err)
	}
	for _, id := range []string{"b1", "b2"} {
		if _, err := s.Create(ctx, id, "team-b", "python", 0); err != nil {
			t.Fatalf("another tenant's session %s: %v", id, err)
		}
	}
	if got := s.ByTenant(); len(got) != 2 || got["team-a"] != 2 || got["team-b"] != 2 {
		t.Errorf("ByTenant() = %v, want team-a and team-b with 2 each", got)
	}
	// Every session is open: a third tenant hits the agent's limit.
	if _, err := s.Create(ctx, "c1", "team-c", "python", 0); errors.As(err, &limit) || !errors.Is(err, ErrTooManySessions) {
		t.Errorf("session beyond the agent's limit: %v, want ErrTooManySessions without a tenant limit", err)
	}
	if err := s.Close("a1", "team-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Create(ctx, "a4", "team-a", "python", 0); err != nil {
		t.Errorf("a session after closing one: %v", err)
	}
}

// When the image name names another image (rebuilt or retagged), warm
// sandboxes of the old one are replaced at once, one at work when its run
// ends (not scrubbed), and a session's stays with it.
func TestPoolReplacesOldImage(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	m := NewMetrics()
	p := newTestPool(t, d, func(c *Config) { c.MinWarm, c.Max, c.MaxReuse, c.Metrics = 2, 5, 10, m })
	testkit.WaitFor(t, 10*time.Second, "two warm sandboxes", func() bool { return p.Stats().Warm == 2 })
	busy, err := p.Acquire(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	held, err := p.Hold(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "two warm sandboxes again", func() bool { return p.Stats().Warm == 2 })
	old := p.warmIDs()

	d.setImage("sha256:two")
	p.checkEngine() // the watch loop's next check, now
	testkit.WaitFor(t, 10*time.Second, "two warm sandboxes of the new image", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		n := 0
		for _, sb := range p.warm {
			if sb.image == "sha256:two" {
				n++
			}
		}
		return n == 2 && len(p.warm) == 2
	})
	// Removal runs beside the starts (destroyLocked), so the new image's
	// sandboxes may be warm a moment before the old ones are gone.
	testkit.WaitFor(t, 10*time.Second, "the old image's warm sandboxes removed", func() bool {
		for _, id := range old {
			if c := d.get(id); c != nil && !isDone(c) {
				return false
			}
		}
		return true
	})
	c := d.get(busy.ID())
	p.Release(t.Context(), busy, true)
	testkit.WaitFor(t, 10*time.Second, "the old image's busy sandbox removed", func() bool { return isDone(c) })
	if n := c.resets.Load(); n != 0 {
		t.Errorf("the old image's sandbox was scrubbed %d times for reuse", n)
	}
	if isDone(d.get(held.ID())) {
		t.Error("the session's sandbox was removed")
	}
	if err := run(t, held, "x"); err != nil {
		t.Errorf("a run in the session after the change: %v", err)
	}
	if got := counted(t, m.destroyed, destroyImageChanged); got != 3 {
		t.Errorf("destroyed for the image: %v, want 3 (two warm, one at work)", got)
	}
	sb, err := p.Acquire(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if sb.image != "sha256:two" {
		t.Errorf("a run after the change took a sandbox of image %q", sb.image)
	}
	p.Release(t.Context(), sb, true)
	p.Drop(held)
}

// warmIDs returns the ids of the warm sandboxes.
func (p *Pool) warmIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for _, sb := range p.warm {
		ids = append(ids, sb.ID())
	}
	return ids
}

// TestPoolGrowsPastMinWarmOnlyWithCPUsToSpare: the pool keeps MinWarm
// sandboxes idle beside those at work while no run waits for a CPU slot,
// and only MinWarm in all once one has (spareQuiet).
func TestPoolGrowsPastMinWarmOnlyWithCPUsToSpare(t *testing.T) {
	t.Parallel()
	d := newFakeDriver()
	gate := cpuslots.New(1, time.Hour)
	p := newTestPool(t, d, func(c *Config) { c.MinWarm, c.Max, c.Gate = 2, 6, gate })
	testkit.WaitFor(t, 10*time.Second, "two warm sandboxes", func() bool { return p.Stats().Warm == 2 })

	// No run has waited: a sandbox at work is replaced on the warm list.
	first, err := p.Acquire(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "two warm beside the one at work", func() bool {
		st := p.Stats()
		return st.Warm == 2 && st.Busy == 1 && st.Starting == 0
	})

	// A run waits for the one slot.
	tk, err := gate.Enter(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		tk, err := gate.Enter(t.Context())
		tk.Leave()
		waited <- err
	}()
	testkit.WaitFor(t, 10*time.Second, "a run waiting for a slot", func() bool { return gate.Stats().Waiting == 1 })
	tk.Leave()
	if err := <-waited; err != nil {
		t.Fatal(err)
	}

	// Now the two warm ones taken leave three at work and none idle: past
	// MinWarm in all, so none is started.
	var taken []*Sandbox
	for range 2 {
		sb, err := p.Acquire(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		taken = append(taken, sb)
	}
	if testkit.Until(time.Second, func() bool { st := p.Stats(); return st.Starting > 0 || st.Warm > 0 }) {
		t.Fatalf("the pool grew while runs waited for the CPUs: %+v", p.Stats())
	}
	// They come back after their scrubs, and serve the next callers.
	for _, sb := range append(taken, first) {
		p.Release(t.Context(), sb, true)
	}
	testkit.WaitFor(t, 10*time.Second, "three warm again", func() bool { st := p.Stats(); return st.Warm == 3 && st.Busy == 0 })
}
