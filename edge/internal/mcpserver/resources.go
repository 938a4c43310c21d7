package mcpserver

import (
	"context"
	"fmt"
	"mime"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
	"github.com/codemode-go/codemode/internal/server"
)

// The resources of the server with execute_code, each named by a URI
// that says whose it is:
//
//   - codemode://runs/RUN/artifacts/NAME is the file NAME a run left in
//     /workspace/outputs, as the run's result had it; RUN is the request
//     id of the execute_code call. execute_code returns these URIs. The
//     edge keeps the artifacts of an MCP session's last runs in memory
//     for a while (see Retention), for that session only.
//   - codemode://sessions/SESSION/files/PATH is the file at
//     /workspace/PATH of the code session SESSION, read when asked, for as
//     long as the session lasts, by the tenant it belongs to (the edge's
//     execution service refuses any other, as it does read_file).
//
// resources/list lists the artifacts the MCP session keeps and the files
// of the code sessions it opened or used and has not closed.
const (
	resourceScheme   = "codemode"
	artifactTemplate = "codemode://runs/{run_id}/artifacts/{+name}"
	fileTemplate     = "codemode://sessions/{session_id}/files/{+path}"
)

// Default retention of runs' artifacts (see Retention).
const (
	DefaultRetainedRuns  = 16
	DefaultRetainedBytes = 64 << 20
	DefaultRetentionTTL  = 30 * time.Minute
)

// Bounds of resources/list: how much of a code session's /workspace it
// walks.
const (
	listMaxDirs    = 16
	listMaxEntries = 200
	// maxSessionsListed is how many code sessions an MCP session
	// remembers for resources/list, the last used.
	maxSessionsListed = 16
)

// Retention bounds what the edge keeps of runs' artifacts so that
// resources/read can return them after the result: the artifacts of an MCP
// session's last Runs runs, for TTL, and of all sessions together at most
// Bytes (the oldest go first). A run whose artifacts alone are over Bytes
// is not kept. They are kept in memory: a restart, or another edge
// replica, does not have them.
type Retention struct {
	Runs  int
	Bytes int64
	TTL   time.Duration
}

func (r Retention) withDefaults() Retention {
	if r.Runs <= 0 {
		r.Runs = DefaultRetainedRuns
	}
	if r.Bytes <= 0 {
		r.Bytes = DefaultRetainedBytes
	}
	if r.TTL <= 0 {
		r.TTL = DefaultRetentionTTL
	}
	return r
}

// artifactURI names the artifact name of run runID.
func artifactURI(runID, name string) string {
	u := url.URL{Scheme: resourceScheme, Host: "runs", Path: "/" + runID + "/artifacts/" + name}
	return u.String()
}

// fileURI names the file at /workspace/p of code session id.
func fileURI(id, p string) string {
	u := url.URL{Scheme: resourceScheme, Host: "sessions", Path: "/" + id + "/files/" + strings.TrimPrefix(p, "/")}
	return u.String()
}

// parseResourceURI splits a resource URI into its kind ("runs" or
// "sessions"), the run or session id, and the name or path in it.
func parseResourceURI(uri string) (kind, id, name string, err error) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != resourceScheme || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", "", "", fmt.Errorf("not a codemode resource URI")
	}
	want := map[string]string{"runs": "artifacts", "sessions": "files"}[u.Host]
	parts := strings.SplitN(strings.TrimPrefix(u.Path, "/"), "/", 3)
	if want == "" || len(parts) != 3 || parts[0] == "" || parts[1] != want || parts[2] == "" {
		return "", "", "", fmt.Errorf("not a codemode resource URI")
	}
	return u.Host, parts[0], parts[2], nil
}

// runStore keeps runs' artifacts and the code sessions each MCP session
// used (see Retention). An MCP session is bound to whoever opened it (see
// bindSessions), so what it keeps is theirs.
type runStore struct {
	cfg Retention
	now func() time.Time

	mu       sync.Mutex
	bytes    int64
	runs     []*retainedRun // oldest first
	sessions map[*mcp.ServerSession]*usedSessions
}

type retainedRun struct {
	owner     *mcp.ServerSession
	id        string
	at        time.Time
	size      int64
	artifacts []*executionv1.Artifact
}

// usedSessions are the code sessions an MCP session used, the last last.
type usedSessions struct {
	ids  []string
	last time.Time
}

func newRunStore(cfg Retention) *runStore {
	return &runStore{cfg: cfg, now: time.Now, sessions: map[*mcp.ServerSession]*usedSessions{}}
}

// keep keeps the artifacts of run id of MCP session ss.
func (s *runStore) keep(ss *mcp.ServerSession, id string, artifacts []*executionv1.Artifact) {
	var size int64
	for _, a := range artifacts {
		size += int64(len(a.GetContent()))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.drop(func(r *retainedRun) bool { return r.owner == ss && r.id == id })
	if len(artifacts) == 0 || size > s.cfg.Bytes {
		s.expire(now)
		return
	}
	s.runs = append(s.runs, &retainedRun{owner: ss, id: id, at: now, size: size, artifacts: artifacts})
	s.bytes += size
	s.expire(now)
}

// expire drops what is past its time or over the bounds; s.mu is held.
func (s *runStore) expire(now time.Time) {
	s.drop(func(r *retainedRun) bool { return now.Sub(r.at) > s.cfg.TTL })
	count := map[*mcp.ServerSession]int{}
	for _, r := range s.runs {
		count[r.owner]++
	}
	for i := 0; i < len(s.runs); {
		r := s.runs[i]
		if count[r.owner] > s.cfg.Runs || s.bytes > s.cfg.Bytes {
			count[r.owner]--
			s.bytes -= r.size
			s.runs = slices.Delete(s.runs, i, i+1)
			continue
		}
		i++
	}
	for ss, u := range s.sessions {
		if now.Sub(u.last) > s.cfg.TTL {
			delete(s.sessions, ss)
		}
	}
}

// drop removes the runs for which f is true; s.mu is held.
func (s *runStore) drop(f func(*retainedRun) bool) {
	s.runs = slices.DeleteFunc(s.runs, func(r *retainedRun) bool {
		if f(r) {
			s.bytes -= r.size
			return true
		}
		return false
	})
}

// artifact returns the artifact name of run id of MCP session ss.
func (s *runStore) artifact(ss *mcp.ServerSession, id, name string) (*executionv1.Artifact, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.now())
	for _, r := range s.runs {
		if r.owner == ss && r.id == id {
			for _, a := range r.artifacts {
				if a.GetName() == name {
					return a, true
				}
			}
		}
	}
	return nil, false
}

// list returns the resources of the artifacts MCP session ss keeps.
func (s *runStore) list(ss *mcp.ServerSession) []*mcp.Resource {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.now())
	var out []*mcp.Resource
	for _, r := range s.runs {
		if r.owner != ss {
			continue
		}
		for _, a := range r.artifacts {
			out = append(out, &mcp.Resource{URI: artifactURI(r.id, a.GetName()), Name: a.GetName(),
				Title: fmt.Sprintf("%s (run %s)", a.GetName(), r.id), MIMEType: a.GetMediaType(), Size: int64(len(a.GetContent()))})
		}
	}
	return out
}

// useSession records that MCP session ss used code session id.
func (s *runStore) useSession(ss *mcp.ServerSession, id string) {
	if id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.sessions[ss]
	if u == nil {
		u = &usedSessions{}
		s.sessions[ss] = u
	}
	u.ids = append(slices.DeleteFunc(u.ids, func(x string) bool { return x == id }), id)
	if len(u.ids) > maxSessionsListed {
		u.ids = slices.Delete(u.ids, 0, len(u.ids)-maxSessionsListed)
	}
	u.last = s.now()
}

// forgetSession records that MCP session ss closed code session id.
func (s *runStore) forgetSession(ss *mcp.ServerSession, id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u := s.sessions[ss]; u != nil {
		u.ids = slices.DeleteFunc(u.ids, func(x string) bool { return x == id })
	}
}

// usedBy returns the code sessions MCP session ss used.
func (s *runStore) usedBy(ss *mcp.ServerSession) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u := s.sessions[ss]; u != nil {
		return slices.Clone(u.ids)
	}
	return nil
}

// addResources gives srv the resources: templates for resources/read, and
// resources/list answered for the calling MCP session.
func (s *Servers) addResources(srv *mcp.Server) {
	r := &resources{open: s.cfg.Open, runs: s.runs}
	srv.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "artifact",
		Title:       "A run's artifact",
		URITemplate: artifactTemplate,
		Description: "A file a run (execute_code; run_id is its request id) left in /workspace/outputs, as its result had it; " +
			"kept for a while after the run, for the MCP session that ran it.",
	}, r.readArtifact)
	srv.AddResourceTemplate(&mcp.ResourceTemplate{
		Name:        "session-file",
		Title:       "A session's file",
		URITemplate: fileTemplate,
		Description: "The file at /workspace/{path} of a code session, as it is now, while the session lasts.",
	}, r.readFile)
	srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if l, ok := req.(*mcp.ListResourcesRequest); ok && method == "resources/list" {
				return r.list(ctx, l)
			}
			return next(ctx, method, req)
		}
	})
}

type resources struct {
	open Opener
	runs *runStore
}

func extraHeader(e *mcp.RequestExtra) http.Header {
	if e == nil {
		return nil
	}
	return e.Header
}

func (r *resources) readArtifact(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	kind, run, name, err := parseResourceURI(uri)
	if err != nil || kind != "runs" {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	// The same keys and policies as a tool call.
	if _, _, err := r.open(ctx, extraHeader(req.Extra)); err != nil {
		return nil, err
	}
	a, ok := r.runs.artifact(req.Session, run, name)
	if !ok {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{contents(uri, a.GetMediaType(), a.GetContent())}}, nil
}

func (r *resources) readFile(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	kind, session, p, err := parseResourceURI(uri)
	if err != nil || kind != "sessions" {
		return nil, mcp.ResourceNotFoundError(uri)
	}
	b, id, err := r.open(ctx, extraHeader(req.Extra))
	if err != nil {
		return nil, err
	}
	f, err := b.ReadFile(ctx, session, p)
	if err != nil {
		return nil, failed(id, err)
	}
	mt := mime.TypeByExtension(path.Ext(p))
	if mt == "" {
		mt = http.DetectContentType(f.GetContent())
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{contents(uri, mt, f.GetContent())}}, nil
}

// contents is a resource's contents: text when it is text in UTF-8, else
// a blob.
func contents(uri, mediaType string, b []byte) *mcp.ResourceContents {
	c := &mcp.ResourceContents{URI: uri, MIMEType: mediaType}
	if isText(mediaType) && utf8.Valid(b) {
		c.Text = string(b)
	} else {
		c.Blob = b
	}
	return c
}

// list answers resources/list: the artifacts the calling MCP session
// keeps, then the files of the code sessions it used, walking each
// /workspace breadth first within listMaxDirs directories and
// listMaxEntries files. A session that cannot be listed (closed, expired)
// is left out.
func (r *resources) list(ctx context.Context, req *mcp.ListResourcesRequest) (*mcp.ListResourcesResult, error) {
	out := &mcp.ListResourcesResult{Resources: []*mcp.Resource{}}
	if req.Params != nil && req.Params.Cursor != "" {
		return out, nil // everything came on the first page
	}
	out.Resources = append(out.Resources, r.runs.list(req.Session)...)
	used := r.runs.usedBy(req.Session)
	if len(used) == 0 {
		return out, nil
	}
	b, _, err := r.open(ctx, extraHeader(req.Extra))
	if err != nil {
		return nil, err
	}
	for _, id := range used {
		dirs, files := []string{""}, 0
		for n := 0; len(dirs) > 0 && n < listMaxDirs && files < listMaxEntries; n++ {
			dir := dirs[0]
			dirs = dirs[1:]
			entries, _, err := b.ListFiles(ctx, id, dir)
			if err != nil {
				break
			}
			for _, e := range entries {
				if e.GetDir() {
					dirs = append(dirs, e.GetPath())
					continue
				}
				if files++; files > listMaxEntries {
					break
				}
				out.Resources = append(out.Resources, &mcp.Resource{URI: fileURI(id, e.GetPath()), Name: e.GetPath(),
					Title: fmt.Sprintf("/workspace/%s (session %s)", e.GetPath(), id), MIMEType: mime.TypeByExtension(path.Ext(e.GetPath())), Size: int64(e.GetSize())})
			}
		}
	}
	return out, nil
}

// runID names a run for its artifacts' URIs: the request id, or a new one
// where there is none.
func runID(requestID string) string {
	if requestID == "" {
		return server.NewRequestID()
	}
	return requestID
}
