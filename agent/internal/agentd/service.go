package agentd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/codemode-go/codemode/agent/internal/cpuslots"
	"github.com/codemode-go/codemode/agent/internal/egressgate"
	"github.com/codemode-go/codemode/agent/internal/languages"
	"github.com/codemode-go/codemode/agent/internal/pool"
	"github.com/codemode-go/codemode/agent/internal/wire"
	agentv1 "github.com/codemode-go/codemode/gen/codemode/agent/v1"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
	"github.com/codemode-go/codemode/internal/limits"
	"github.com/codemode-go/codemode/internal/telemetry"
)

// Errors of the service, besides those of packages pool, sandbox and wire.
var (
	// errInvalid marks a request the service refuses as malformed.
	errInvalid = errors.New("invalid request")
)

// notStarted wraps the failure of a call that took no effect: a stateless
// run that got no sandbox, a session that was not created. The control
// plane may offer such a call to another agent (cluster.MarkNotStarted).
// Its message is the error's own.
type notStarted struct{ error }

func (e notStarted) Unwrap() error { return e.error }

// isNotStarted reports whether err is, or wraps, a notStarted.
func isNotStarted(err error) bool {
	var ns notStarted
	return errors.As(err, &ns)
}

// runGrace is how long after a run's timeout the agent waits for the
// runner's own report before it cancels the run itself.
const runGrace = 2 * time.Second

// canonicalLanguage returns the table's name for name (a name or an alias),
// or an invalid-argument error listing the table's names.
func canonicalLanguage(name string) (string, error) {
	l, ok := languages.Lookup(name)
	if !ok {
		return "", fmt.Errorf("%w: %w", errInvalid, limits.UnknownLanguage(name, languages.Names()))
	}
	return l.Name, nil
}

// Service is the agent's one internal service: the Connect handlers are a
// thin adapter over it. It is safe for concurrent use.
type Service struct {
	cfg      *Config
	log      *slog.Logger
	pool     *pool.Pool
	gate     *cpuslots.Gate // admission of runs to the CPUs
	sessions *pool.Sessions
	egress   *egressgate.Gate
	metrics  *telemetry.Metrics
}

// Call is one request to run a program.
type Call struct {
	// Tenant asks; in a session, it must own the session.
	Tenant string
	// RequestID is the edge's id of the request, for logs.
	RequestID string
	// AllowNewSession lets a run in a session of an id that never existed
	// open it.
	AllowNewSession bool
	Execution       *executionv1.Execution
	// Egress is what the run may reach outside its sandbox; nil: nothing.
	Egress *executionv1.Egress
}

// Execute runs c.Execution. If emit is not nil, output chunks are passed to it as
// they are produced (from another goroutine than the run's, so that a slow
// receiver never holds the run up beyond its timeout) and the returned
// result carries no output; otherwise the result carries all of it. A
// program that fails is a result, not an error.
//
// The result reports what the run did through its egress, if anything.
func (s *Service) Execute(ctx context.Context, c Call, emit func(*executionv1.Event) error) (*executionv1.Result, error) {
	p, err := s.plan(c.Execution)
	if err != nil {
		return nil, err
	}
	eg := s.egress.Begin(c.Egress, c.Tenant, c.RequestID)
	out := newOutput(emit)
	// However the run ends, emit is not called once Execute has returned:
	// it sends on the caller's stream, which ends with the handler.
	defer out.stop()
	if p.session != "" {
		return s.executeInSession(ctx, c, p, out, eg)
	}
	return s.executeStateless(ctx, p, out, eg)
}

// runPlan is what the agent makes of an execution: the runner's request,
// with every limit set.
type runPlan struct {
	run     *runnerv1.Run
	timeout time.Duration
	// memory is the memory of a sandbox of the run's own; 0: the pool's.
	memory  int64
	session string // "" for a stateless run
}

// plan checks exec and fills in what it leaves to the agent: the language
// (canonical), the timeout and the output and memory limits, each within
// the agent's maxima. Requests from the edge come with the language and
// timeout already set from the agent's reported defaults (see
// docs/design.md, "Request path"); these are the same defaults, for
// requests made to the agent directly.
func (s *Service) plan(exec *executionv1.Execution) (runPlan, error) {
	lang := exec.GetLanguage()
	if lang == "" {
		lang = languages.Default
	}
	lang, err := canonicalLanguage(lang)
	if err != nil {
		return runPlan{}, err
	}
	if exec.GetCode() == "" {
		return runPlan{}, fmt.Errorf("%w: no code", errInvalid)
	}
	timeout := s.cfg.DefaultTimeout
	if d := exec.GetTimeout(); d != nil && d.AsDuration() > 0 {
		timeout = d.AsDuration()
	}
	timeout = min(timeout, s.cfg.MaxTimeout)
	output := s.cfg.DefaultOutput
	if b := exec.GetLimits().GetOutputBytes(); b > 0 {
		output = int64(min(b, uint64(s.cfg.MaxOutput)))
	}
	output = min(output, s.cfg.MaxOutput)
	// A memory limit up to the warm sandboxes' own is enforced by the
	// runner in a warm sandbox; a larger one needs a sandbox of its own.
	var memory, runMemory int64 // 0: the pool's default
	if b := exec.GetLimits().GetMemoryBytes(); b > 0 {
		runMemory = max(int64(min(b, uint64(s.cfg.MaxMemory))), limits.MinMemoryBytes)
		if runMemory > s.pool.DefaultMemory() {
			memory = runMemory
		}
	}
	run := &runnerv1.Run{
		Language:    lang,
		Code:        exec.GetCode(),
		Stdin:       exec.GetStdin(),
		Timeout:     durationpb.New(timeout),
		OutputLimit: uint64(output),
		Stateful:    exec.GetSessionId() != "",
		MemoryLimit: uint64(runMemory),
	}
	for _, f := range exec.GetFiles() {
		run.Files = append(run.Files, &runnerv1.File{Path: f.GetPath(), Content: f.GetContent()})
	}
	return runPlan{run: run, timeout: timeout, memory: memory, session: exec.GetSessionId()}, nil
}

// executeInSession runs p in the sandbox of its session.
func (s *Service) executeInSession(ctx context.Context, c Call, p runPlan, out *output, eg *egressgate.Run) (*executionv1.Result, error) {
	var res *executionv1.Result
	_, err := s.sessions.Use(ctx, p.session, c.Tenant, p.run.GetLanguage(), p.memory, c.AllowNewSession, func(sb *pool.Sandbox) (bool, error) {
		// The session's sandbox is the caller's alone; its turn for
		// the CPUs is waited for like any other run's.
		slot, err := s.admit(ctx)
		if err != nil {
			return false, err
		}
		defer slot.Leave()
		var broken bool
		res, broken, err = s.run(ctx, sb, p.run, p.timeout, out, eg)
		return broken, err
	})
	if err != nil {
		return nil, err
	}
	res.SessionId = p.session
	return res, out.wait()
}

// executeStateless runs p in a sandbox of the pool.
func (s *Service) executeStateless(ctx context.Context, p runPlan, out *output, eg *egressgate.Run) (*executionv1.Result, error) {
	// A run waits for its turn at the CPUs before it takes a sandbox, so
	// that runs waiting for it hold no sandbox, and the pool starts none
	// for them.
	lang := p.run.GetLanguage()
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueueTimeout)
	qctx, span := telemetry.StartSpan(qctx, "sandbox.acquire", telemetry.AttrLanguage.String(lang))
	queued := time.Now()
	slot, err := s.gate.Enter(qctx)
	var sb *pool.Sandbox
	if err == nil {
		sb, err = s.pool.AcquireFor(qctx, p.memory, lang, p.run.GetCode())
	}
	cancel()
	s.metrics.ObserveQueueWait(time.Since(queued))
	telemetry.EndSpan(span, err)
	if err != nil {
		slot.Leave()
		return nil, notStarted{err}
	}
	res, broken, err := s.run(ctx, sb, p.run, p.timeout, out, eg)
	// The scrub that Release starts takes a slot before this run's is
	// given back.
	s.pool.Release(ctx, sb, !broken)
	slot.Leave()
	if err != nil {
		return nil, err
	}
	return res, out.wait()
}

// admit waits, up to the queue timeout, for the turn at the CPUs of a run
// in a session (whose sandbox it already has).
func (s *Service) admit(ctx context.Context) (*cpuslots.Ticket, error) {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueueTimeout)
	defer cancel()
	slot, err := s.gate.Enter(qctx)
	if err != nil {
		return nil, notStarted{err}
	}
	return slot, nil
}

// run runs one program in sb and says whether sb must be destroyed.
func (s *Service) run(ctx context.Context, sb *pool.Sandbox, run *runnerv1.Run, timeout time.Duration, out *output, eg *egressgate.Run) (_ *executionv1.Result, broken bool, _ error) {
	rctx, cancel := context.WithTimeout(ctx, timeout+runGrace)
	defer cancel()
	rctx, span := telemetry.StartSpan(rctx, "runner",
		telemetry.AttrLanguage.String(run.GetLanguage()), telemetry.AttrSession.Bool(run.GetStateful()))
	exit, err := sb.Run(rctx, run, out.write, eg)
	var died *pool.DiedError
	if exit != nil && span.IsRecording() {
		span.SetAttributes(telemetry.AttrExitCode.Int(int(exit.GetCode())),
			telemetry.AttrOutcome.String(telemetry.Outcome(&executionv1.Result{ExitCode: exit.GetCode(), TimedOut: exit.GetTimedOut(), OomKilled: exit.GetOomKilled()}, nil)))
	}
	telemetry.EndSpan(span, err)
	res := &executionv1.Result{Agent: s.cfg.Name, Egress: eg.Report()}
	switch {
	case err == nil:
		fillResult(res, exit)
		// A program the runner saw killed for memory may have left the
		// sandbox in a bad way: do not give it to an unrelated run. A
		// session keeps its sandbox (and files); the runner restarts its
		// interpreter.
		return out.finish(res), exit.GetOomKilled() && !run.GetStateful(), nil

	case errors.As(err, &died):
		// The runner or the whole sandbox died; the pool asked the
		// engine why and destroys the sandbox.
		switch {
		case died.OOMKilled:
			res.ExitCode = 137
			res.OomKilled = true
			res.Duration = durationpb.New(time.Since(out.start))
			return out.finish(res), true, nil
		case ctx.Err() != nil:
			return nil, true, ctx.Err()
		case rctx.Err() != nil:
			// The runner did not report the end of the run in time and
			// did not answer its cancellation: the run is over all the
			// same.
			res.ExitCode = -1
			res.TimedOut = true
			res.Duration = durationpb.New(time.Since(out.start))
			return out.finish(res), true, nil
		}
		return nil, true, err

	case exit != nil && ctx.Err() == nil && rctx.Err() != nil:
		// The runner ended the run only when the agent cancelled it.
		fillResult(res, exit)
		res.TimedOut = true
		return out.finish(res), true, nil

	case ctx.Err() != nil:
		// The caller went away; the runner killed the run.
		return nil, exit == nil, ctx.Err()

	default:
		var rerr *wire.RunnerError
		if errors.As(err, &rerr) {
			return nil, false, err
		}
		return nil, true, err
	}
}

func fillResult(res *executionv1.Result, exit *runnerv1.Exit) {
	res.ExitCode = exit.GetCode()
	res.TimedOut = exit.GetTimedOut()
	res.Truncated = exit.GetTruncated()
	res.OomKilled = exit.GetOomKilled()
	res.Duration = exit.GetDuration()
	res.ArtifactsTruncated = exit.GetArtifactsTruncated()
	for _, a := range exit.GetArtifacts() {
		res.Artifacts = append(res.Artifacts, &executionv1.Artifact{
			Name:      a.GetName(),
			MediaType: a.GetMediaType(),
			Content:   a.GetContent(),
			Size:      uint64(len(a.GetContent())),
		})
	}
}

// CreateSession opens a session.
func (s *Service) CreateSession(ctx context.Context, req *agentv1.CreateSessionRequest) (*executionv1.Session, error) {
	lang := req.GetLanguage()
	if lang == "" {
		lang = languages.Default
	}
	lang, err := canonicalLanguage(lang)
	if err != nil {
		return nil, err
	}
	var idle time.Duration
	if d := req.GetIdleTimeout(); d != nil {
		idle = d.AsDuration()
	}
	// Refused rather than cut, as a run's timeout is at the edge: a
	// session that expired sooner than it asked would lose its state by
	// surprise.
	if idle > s.cfg.MaxSessionIdleTTL {
		return nil, fmt.Errorf("%w: idle timeout %v is longer than a tenant's session may ask for (%v, --max-session-idle-ttl)", errInvalid, idle, s.cfg.MaxSessionIdleTTL)
	}
	qctx, cancel := context.WithTimeout(ctx, s.cfg.QueueTimeout)
	defer cancel()
	info, err := s.sessions.Create(qctx, req.GetSessionId(), req.GetTenant(), lang, idle)
	if err != nil {
		return nil, notStarted{err}
	}
	return s.session(info), nil
}

// GetSession describes tenant's open session id.
func (s *Service) GetSession(id, tenant string) (*executionv1.Session, error) {
	info, err := s.sessions.Info(id, tenant)
	if err != nil {
		return nil, err
	}
	return s.session(info), nil
}

func (s *Service) session(info pool.Info) *executionv1.Session {
	return &executionv1.Session{
		Id:         info.ID,
		Language:   info.Language,
		Agent:      s.cfg.Name,
		CreateTime: timestamppb.New(info.Created),
		ExpireTime: timestamppb.New(info.Expires),
	}
}

// CloseSession closes tenant's session id and destroys its sandbox.
func (s *Service) CloseSession(_ context.Context, id, tenant string) error {
	return s.sessions.Close(id, tenant)
}

// ListFiles lists a directory of tenant's session id's workspace.
func (s *Service) ListFiles(ctx context.Context, id, tenant, path string) (*agentv1.ListFilesResponse, error) {
	res := &agentv1.ListFilesResponse{}
	err := s.sessions.With(ctx, id, tenant, func(sb *pool.Sandbox) error {
		l, err := sb.List(ctx, path)
		if err != nil {
			return err
		}
		res.Truncated = l.GetTruncated()
		for _, f := range l.GetFiles() {
			res.Files = append(res.Files, &executionv1.FileInfo{Path: f.GetPath(), Size: f.GetSize(), Dir: f.GetDir(), Mode: f.GetMode()})
		}
		return nil
	})
	return res, err
}

// ReadFile reads a file of tenant's session id's workspace.
func (s *Service) ReadFile(ctx context.Context, id, tenant, path string, max uint64) (*executionv1.File, error) {
	var file *executionv1.File
	err := s.sessions.With(ctx, id, tenant, func(sb *pool.Sandbox) error {
		f, err := sb.ReadFile(ctx, path, max)
		if err != nil {
			return err
		}
		file = &executionv1.File{Path: path, Content: f.GetContent()}
		return nil
	})
	return file, err
}

// WriteFile writes a file into tenant's session id's workspace.
func (s *Service) WriteFile(ctx context.Context, id, tenant string, f *executionv1.File) error {
	return s.sessions.With(ctx, id, tenant, func(sb *pool.Sandbox) error {
		return sb.WriteFile(ctx, &runnerv1.File{Path: f.GetPath(), Content: f.GetContent()})
	})
}

// Status reports the agent's load and capacity.
func (s *Service) Status() *agentv1.AgentStatus {
	st := s.pool.Stats()
	sessions := s.sessions.Len()
	langs := describeLanguages(st.Versions, s.preloaded(st.PreloadMissing))
	return &agentv1.AgentStatus{
		Name:      s.cfg.Name,
		Labels:    s.cfg.Labels,
		Warm:      int32(st.Warm),
		Busy:      int32(st.Busy + s.sessions.Running()),
		Sessions:  int32(sessions),
		Capacity:  int32(st.Max),
		Free:      int32(max(st.Max-st.Busy-sessions, 0)),
		Languages: langs,
		Runtime:   s.cfg.Runtime,
		// Not before the pool has warmed: a control plane routing to an
		// agent still starting its sandboxes would hold each run there
		// for a start while warm agents idle.
		Ready:          st.Ready && st.Warmed,
		Defaults:       s.defaults(),
		TenantSessions: tenantSessions(s.sessions.ByTenant()),
	}
}

// tenantSessions converts a count of sessions by tenant for the status.
func tenantSessions(by map[string]int) map[string]int32 {
	if len(by) == 0 {
		return nil
	}
	out := make(map[string]int32, len(by))
	for t, n := range by {
		out[t] = int32(n)
	}
	return out
}

// output gathers a run's output: for a stream, it decodes each chunk to
// UTF-8 and queues it for a sender goroutine; otherwise it keeps the bytes
// and decodes them at the end.
type output struct {
	start          time.Time
	stream         bool
	stdout, stderr []byte
	dout, derr     utf8Decoder

	mu      sync.Mutex
	queue   []*executionv1.Event
	signal  chan struct{} // has a token when queue is not empty or closed
	closed  bool
	sendErr error
	done    chan struct{} // closed when the sender has stopped
}

func newOutput(emit func(*executionv1.Event) error) *output {
	o := &output{start: time.Now(), stream: emit != nil}
	if emit != nil {
		o.signal = make(chan struct{}, 1)
		o.done = make(chan struct{})
		go o.send(emit)
	}
	return o
}

// write takes one chunk; it never blocks on the receiver.
func (o *output) write(stream wire.Stream, chunk []byte) {
	if !o.stream {
		if stream == wire.Stderr {
			o.stderr = append(o.stderr, chunk...)
		} else {
			o.stdout = append(o.stdout, chunk...)
		}
		return
	}
	var ev *executionv1.Event
	if stream == wire.Stderr {
		if s := o.derr.Decode(chunk); s != "" {
			ev = &executionv1.Event{Event: &executionv1.Event_Stderr{Stderr: s}}
		}
	} else if s := o.dout.Decode(chunk); s != "" {
		ev = &executionv1.Event{Event: &executionv1.Event_Stdout{Stdout: s}}
	}
	if ev != nil {
		o.push(ev)
	}
}

func (o *output) push(ev *executionv1.Event) {
	o.mu.Lock()
	if o.sendErr == nil {
		o.queue = append(o.queue, ev)
	}
	o.mu.Unlock()
	select {
	case o.signal <- struct{}{}:
	default:
	}
}

// finish completes res: with the output for an aggregated run, after the
// held-back tails for a stream.
func (o *output) finish(res *executionv1.Result) *executionv1.Result {
	if !o.stream {
		var d utf8Decoder
		res.Stdout = d.Decode(o.stdout) + d.Flush()
		res.Stderr = d.Decode(o.stderr) + d.Flush()
		return res
	}
	if s := o.dout.Flush(); s != "" {
		o.push(&executionv1.Event{Event: &executionv1.Event_Stdout{Stdout: s}})
	}
	if s := o.derr.Flush(); s != "" {
		o.push(&executionv1.Event{Event: &executionv1.Event_Stderr{Stderr: s}})
	}
	return res
}

// send passes queued events to emit until the output is closed and the
// queue empty, or emit fails.
func (o *output) send(emit func(*executionv1.Event) error) {
	defer close(o.done)
	for {
		<-o.signal
		for {
			o.mu.Lock()
			if len(o.queue) == 0 {
				closed := o.closed
				o.mu.Unlock()
				if closed {
					return
				}
				break
			}
			ev := o.queue[0]
			o.queue[0] = nil
			o.queue = o.queue[1:]
			o.mu.Unlock()
			if err := emit(ev); err != nil {
				o.mu.Lock()
				o.sendErr = err
				o.queue = nil
				o.mu.Unlock()
				// Keep draining signals until closed, sending nothing.
				for {
					o.mu.Lock()
					closed := o.closed
					o.mu.Unlock()
					if closed {
						return
					}
					<-o.signal
				}
			}
		}
	}
}

// wait closes the queue, waits until the sender has sent everything, and
// returns the sender's error.
func (o *output) wait() error {
	if !o.stream {
		return nil
	}
	o.close()
	<-o.done
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.sendErr != nil {
		return fmt.Errorf("send output: %w", o.sendErr)
	}
	return nil
}

// stop ends the sender without sending what is still queued, and waits for
// it to return. It may be called more than once, and after wait.
func (o *output) stop() {
	if !o.stream {
		return
	}
	o.mu.Lock()
	o.closed = true
	o.queue = nil
	o.mu.Unlock()
	select {
	case o.signal <- struct{}{}:
	default:
	}
	<-o.done
}

// close stops the sender once the queue is empty. It may be called more
// than once.
func (o *output) close() {
	if !o.stream {
		return
	}
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	select {
	case o.signal <- struct{}{}:
	default:
	}
}

// describeLanguages describes the table's languages for callers, with the versions
// the runners found. A language whose program the image lacks is listed
// without a version (and its runs fail naming the program), so that callers
// are told what is missing rather than that the language is unknown.
func describeLanguages(versions map[string]string, preload []string) []*executionv1.Language {
	table := languages.All()
	out := make([]*executionv1.Language, 0, len(table))
	for _, l := range table {
		out = append(out, &executionv1.Language{
			Name:         l.Name,
			Version:      versions[l.Name],
			Aliases:      l.Aliases,
			FileName:     l.File,
			Compiled:     l.Compiled,
			SessionState: l.SessionState(),
			Prestarted:   l.Prestart != nil,
		})
		if l.Parent != nil && l.Prestart != nil {
			out[len(out)-1].Preloaded = preload
		}
	}
	return out
}

// preloaded is what the preloaded parents import: the --preload list less
// the modules the image lacks, none without prestarted interpreters.
func (s *Service) preloaded(missing []string) []string {
	if !s.cfg.Prestart {
		return nil
	}
	return slices.DeleteFunc(languages.PreloadList(s.cfg.Preload), func(m string) bool { return slices.Contains(missing, m) })
}

// defaults reports what runs get for what their requests leave unset, and
// the most they may ask for: the edge checks requests against these.
func (s *Service) defaults() *executionv1.Defaults {
	return &executionv1.Defaults{
		Language:       languages.Default,
		Timeout:        durationpb.New(s.cfg.DefaultTimeout),
		MaxTimeout:     durationpb.New(s.cfg.MaxTimeout),
		MemoryBytes:    uint64(s.pool.DefaultMemory()),
		MaxMemoryBytes: uint64(s.cfg.MaxMemory),
		OutputBytes:    uint64(s.cfg.DefaultOutput),
		MaxOutputBytes: uint64(s.cfg.MaxOutput),
		// The agent's own default, from one place: config.go.
		SessionIdleTimeout: durationpb.New(s.cfg.SessionIdleTTL),
	}
}
