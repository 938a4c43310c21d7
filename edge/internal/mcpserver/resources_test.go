package mcpserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/codemode-go/codemode/edge/internal/tenant"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

// tenantFiles is a Backend whose runs leave artifacts that name their
// tenant, and whose sessions keep files for the tenant that created them
// only, as the edge's execution service does.
type tenantFiles struct {
	scripted
	mu    sync.Mutex
	files map[string]map[string][]byte // by session, then path
	owner map[string]string            // session -> tenant
}

type tenantFilesAs struct {
	*tenantFiles
	tenant string
	id     string
}

func (b *tenantFiles) open(tenants *tenant.Resolver) Opener {
	return func(_ context.Context, h http.Header) (Backend, string, error) {
		t, err := tenants.Resolve(h)
		if err != nil {
			return nil, "", err
		}
		return &tenantFilesAs{b, t, h.Get("X-Request-Id")}, h.Get("X-Request-Id"), nil
	}
}

// artifactsOf are the artifacts a run of tenant t leaves.
func artifactsOf(t string) []*executionv1.Artifact {
	return []*executionv1.Artifact{
		{Name: "report.txt", MediaType: "text/plain; charset=utf-8", Content: []byte("report of " + t + "\n")},
		{Name: "data/table.bin", MediaType: "application/octet-stream", Content: []byte{0, 1, 2, 0xff, byte(len(t))}},
		{Name: "plot.png", MediaType: "image/png", Content: []byte("\x89PNG\r\n\x1a\n" + t)},
	}
}

func (b *tenantFilesAs) Execute(_ context.Context, ex *executionv1.Execution) (*executionv1.Result, error) {
	as := artifactsOf(b.tenant)
	res := &executionv1.Result{Stdout: "ran\n", SessionId: ex.GetSessionId(), Artifacts: as}
	for _, a := range as {
		a.Size = uint64(len(a.Content))
	}
	return res, nil
}

func (b *tenantFilesAs) CreateSession(context.Context, string) (*executionv1.Session, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := "s-" + b.tenant + "-" + rand.Text()[:8]
	b.files[id] = map[string][]byte{}
	b.owner[id] = b.tenant
	return &executionv1.Session{Id: id, Language: "python"}, nil
}

var errNoSession = errors.New("not_found: no such session")

func (b *tenantFilesAs) session(id string) (map[string][]byte, error) {
	if b.owner[id] != b.tenant {
		return nil, errNoSession
	}
	return b.files[id], nil
}

func (b *tenantFilesAs) CloseSession(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := b.session(id); err != nil {
		return err
	}
	delete(b.owner, id)
	delete(b.files, id)
	return nil
}

func (b *tenantFilesAs) WriteFile(_ context.Context, id string, f *executionv1.File) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	files, err := b.session(id)
	if err != nil {
		return err
	}
	files[f.GetPath()] = f.GetContent()
	return nil
}

func (b *tenantFilesAs) ReadFile(_ context.Context, id, p string) (*executionv1.File, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	files, err := b.session(id)
	if err != nil {
		return nil, err
	}
	c, ok := files[p]
	if !ok {
		return nil, errors.New("not_found: no such file")
	}
	return &executionv1.File{Path: p, Content: c}, nil
}

func (b *tenantFilesAs) ListFiles(_ context.Context, id, dir string) ([]*executionv1.FileInfo, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	files, err := b.session(id)
	if err != nil {
		return nil, false, err
	}
	var out []*executionv1.FileInfo
	seen := map[string]bool{}
	prefix := ""
	if dir != "" {
		prefix = dir + "/"
	}
	for p, c := range files {
		rest, ok := strings.CutPrefix(p, prefix)
		if !ok {
			continue
		}
		if first, _, isDir := strings.Cut(rest, "/"); isDir {
			if !seen[first] {
				seen[first] = true
				out = append(out, &executionv1.FileInfo{Path: prefix + first, Dir: true})
			}
			continue
		}
		out = append(out, &executionv1.FileInfo{Path: p, Size: uint64(len(c))})
	}
	return out, false, nil
}

// idTransport sends an API key and a new X-Request-Id with every request.
type idTransport struct{ key string }

func (k idTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+k.key)
	r.Header.Set("X-Request-Id", "req-"+rand.Text()[:10])
	return http.DefaultTransport.RoundTrip(r)
}

// TestResources checks that a run's artifacts and a session's files can be
// listed and read as resources, by the URIs execute_code and write_file
// return, with the same bytes as the run's result; and that another
// tenant reading the same URIs gets an error and lists none of them.
func TestResources(t *testing.T) {
	t.Parallel()
	keyA, keyB := "ka-"+rand.Text(), "kb-"+rand.Text()
	tenants, err := tenant.New(map[string]string{keyA: "alpha", keyB: "beta"})
	if err != nil {
		t.Fatal(err)
	}
	backend := &tenantFiles{files: map[string]map[string][]byte{}, owner: map[string]string{}}
	withCode, _ := New(Config{Open: backend.open(tenants)}).Handlers()
	srv := httptest.NewServer(authenticated(tenants, withCode))
	t.Cleanup(srv.Close)
	connect := func(key string) *mcp.ClientSession {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(t.Context(),
			&mcp.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: &http.Client{Transport: idTransport{key: key}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cs.Close() })
		return cs
	}
	alpha, beta := connect(keyA), connect(keyB)
	if alpha.InitializeResult().Capabilities.Resources == nil {
		t.Fatal("no resources capability")
	}

	// A stateless run: its artifacts come back with URIs resources/read takes.
	uris := runArtifactURIs(t, alpha, beta)

	// A session's files, by the URI write_file returns.
	session, fileURI := writtenFileURI(t, alpha, beta)

	listed := func(cs *mcp.ClientSession) []string {
		t.Helper()
		l, err := cs.ListResources(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range l.Resources {
			out = append(out, r.URI)
		}
		return out
	}
	all := listed(alpha)
	for _, u := range append(slices.Clone(uris), fileURI) {
		if !slices.Contains(all, u) {
			t.Errorf("resources/list lacks %s: %v", u, all)
		}
	}
	if l := listed(beta); len(l) != 0 {
		t.Errorf("another tenant lists %v", l)
	}
	templates, err := alpha.ListResourceTemplates(t.Context(), nil)
	if err != nil || len(templates.ResourceTemplates) != 2 {
		t.Fatalf("templates: %v %v", templates, err)
	}

	// Closed, the session's files are no longer listed.
	if res, err := alpha.CallTool(t.Context(), &mcp.CallToolParams{Name: "close_session", Arguments: map[string]any{"session_id": session}}); err != nil {
		t.Fatal(err)
	} else if res.StructuredContent == nil {
		t.Error("close_session has no structured result")
	}
	if l := listed(alpha); slices.Contains(l, fileURI) {
		t.Errorf("a closed session's file is listed: %v", l)
	}
}

// runArtifactURIs runs code as alpha, reads each artifact by its URI, checks that
// beta cannot, and returns the URIs.
func runArtifactURIs(t *testing.T, alpha, beta *mcp.ClientSession) []string {
	res, err := alpha.CallTool(t.Context(), &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"code": "x"}})
	if err != nil || res.IsError {
		t.Fatalf("execute_code: %v %v", res, err)
	}
	out := res.StructuredContent.(map[string]any)
	var uris []string
	for _, a := range out["artifacts"].([]any) {
		uris = append(uris, a.(map[string]any)["uri"].(string))
	}
	want := artifactsOf("alpha")
	if len(uris) != len(want) || !strings.HasPrefix(uris[0], "codemode://runs/req-") || !strings.HasSuffix(uris[1], "/artifacts/data/table.bin") {
		t.Fatalf("artifact URIs %v", uris)
	}
	for _, c := range res.Content {
		if r, ok := c.(*mcp.EmbeddedResource); ok && !slices.Contains(uris, r.Resource.URI) {
			t.Errorf("embedded resource %s is not among the artifacts' URIs %v", r.Resource.URI, uris)
		}
	}
	for i, uri := range uris {
		got, err := alpha.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: uri})
		if err != nil {
			t.Fatalf("read %s: %v", uri, err)
		}
		c := got.Contents[0]
		b := c.Blob
		if c.Text != "" {
			b = []byte(c.Text)
		}
		if !bytes.Equal(b, want[i].Content) || c.MIMEType != want[i].MediaType || c.URI != uri {
			t.Errorf("read %s: %q (%s), want %q (%s)", uri, b, c.MIMEType, want[i].Content, want[i].MediaType)
		}
		if _, err := beta.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: uri}); err == nil {
			t.Errorf("another tenant read %s", uri)
		}
	}
	return uris
}

// writtenFileURI opens a session as alpha, writes a file, reads it back by the URI
// write_file returns, checks that beta cannot, and returns the session and the URI.
func writtenFileURI(t *testing.T, alpha, beta *mcp.ClientSession) (session, fileURI string) {
	res, err := alpha.CallTool(t.Context(), &mcp.CallToolParams{Name: "create_session", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("create_session: %v %v", res, err)
	}
	session = res.StructuredContent.(map[string]any)["session_id"].(string)
	res, err = alpha.CallTool(t.Context(), &mcp.CallToolParams{Name: "write_file", Arguments: map[string]any{"session_id": session, "path": "in/notes.md", "content": "# notes\n"}})
	if err != nil || res.IsError {
		t.Fatalf("write_file: %v %v", res, err)
	}
	fileURI = res.StructuredContent.(map[string]any)["uri"].(string)
	if fileURI != "codemode://sessions/"+session+"/files/in/notes.md" {
		t.Fatalf("write_file's uri %q", fileURI)
	}
	got, err := alpha.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: fileURI})
	if err != nil || got.Contents[0].Text != "# notes\n" {
		t.Fatalf("read %s: %v %v", fileURI, got, err)
	}
	if _, err := beta.ReadResource(t.Context(), &mcp.ReadResourceParams{URI: fileURI}); err == nil {
		t.Errorf("another tenant read %s", fileURI)
	}
	return session, fileURI
}

// TestRetention checks the bounds of what is kept of runs' artifacts: the
// last runs of a session, the bytes of all, and the time.
func TestRetention(t *testing.T) {
	t.Parallel()
	now := time.Unix(1e9, 0)
	s := newRunStore(Retention{Runs: 2, Bytes: 100, TTL: time.Minute})
	s.now = func() time.Time { return now }
	a, b := &mcp.ServerSession{}, &mcp.ServerSession{}
	art := func(n int) []*executionv1.Artifact {
		return []*executionv1.Artifact{{Name: "f", Content: bytes.Repeat([]byte("x"), n)}}
	}
	has := func(ss *mcp.ServerSession, id string) bool { _, ok := s.artifact(ss, id, "f"); return ok }
	s.keep(a, "1", art(10))
	s.keep(a, "2", art(10))
	s.keep(a, "3", art(10))
	if has(a, "1") || !has(a, "2") || !has(a, "3") {
		t.Error("a session keeps more than its last 2 runs")
	}
	if has(b, "2") {
		t.Error("another session reads a session's run")
	}
	s.keep(b, "4", art(85))
	if has(a, "2") || !has(a, "3") || !has(b, "4") {
		t.Error("over the bytes, the oldest run was not the one dropped")
	}
	s.keep(b, "5", art(101))
	if has(b, "5") {
		t.Error("a run over the bytes by itself was kept")
	}
	now = now.Add(2 * time.Minute)
	if has(a, "3") || has(b, "4") {
		t.Error("runs were kept past their time")
	}
	if s.bytes != 0 {
		t.Errorf("%d bytes counted with nothing kept", s.bytes)
	}
}
