package failover

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/codemode-go/codemode/internal/cluster"
)

// recorder is a base transport that records the host of every request it
// sends.
type recorder struct {
	mu    sync.Mutex
	hosts []string
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.hosts = append(r.hosts, req.URL.Host)
	r.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

func (r *recorder) tried() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.hosts...)
}

// downURL returns the URL of a loopback port where nothing listens.
func downURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// server is a control plane that echoes the body it got, prefixed with
// its name, or turns every call away (refuse), saying so with
// cluster.MarkNotStarted's header when notStarted.
func server(t *testing.T, name string, refuse, notStarted bool) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if refuse {
			if notStarted {
				w.Header().Set(cluster.NotStartedHeader, "1")
			}
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, name+":"+string(body))
	}))
	t.Cleanup(s.Close)
	return s
}

func host(u string) string { return strings.TrimPrefix(u, "http://") }

func post(t *testing.T, c *http.Client, body io.Reader) (int, string) {
	t.Helper()
	res, err := c.Post("http://127.0.0.1:1/call", "text/plain", body)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestMovesOnOnlyWhenRefusedAndSticks(t *testing.T) {
	t.Parallel()
	down, up := downURL(t), server(t, "up", false, false)
	rec := &recorder{}
	tr, err := New([]string{down, up.URL}, rec, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: tr}
	for i := range 2 {
		if code, got := post(t, c, strings.NewReader("run")); code != http.StatusOK || got != "up:run" {
			t.Fatalf("call %d: %d %q, want 200 up:run", i, code, got)
		}
	}
	// The first call tried the refusing address, then the next; the second
	// went straight to the one that accepted.
	want := []string{host(down), host(up.URL), host(up.URL)}
	if got := rec.tried(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("tried %v, want %v", got, want)
	}
}

// A control plane that says it did not start the call passes it on, body
// and all, to the next; one that fails without saying so does not, since
// the call may have started there.
func TestMovesOnWhenNotStarted(t *testing.T) {
	t.Parallel()
	next := server(t, "next", false, false)
	for _, tc := range []struct {
		name       string
		notStarted bool
		body       func() io.Reader
		want       string
	}{
		{"not started", true, func() io.Reader { return strings.NewReader("run") }, "next:run"},
		{"failed", false, func() io.Reader { return strings.NewReader("run") }, ""},
		// A body that cannot be read again cannot be sent again.
		{"not started, body once", true, func() io.Reader { return io.MultiReader(bytes.NewReader([]byte("run"))) }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := server(t, "first", true, tc.notStarted)
			tr, err := New([]string{first.URL, next.URL}, http.DefaultTransport, nil)
			if err != nil {
				t.Fatal(err)
			}
			code, got := post(t, &http.Client{Transport: tr}, tc.body())
			if tc.want == "" {
				if code != http.StatusServiceUnavailable {
					t.Fatalf("got %d %q, want the first control plane's 503", code, got)
				}
				return
			}
			if code != http.StatusOK || got != tc.want {
				t.Fatalf("got %d %q, want 200 %q", code, got, tc.want)
			}
		})
	}
}

func TestFailsWhenNoneAccepts(t *testing.T) {
	t.Parallel()
	tr, err := New([]string{downURL(t), downURL(t)}, http.DefaultTransport, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := (&http.Client{Transport: tr}).Get("http://127.0.0.1:1/"); err == nil {
		res.Body.Close()
		t.Fatal("a call went through with no control plane listening")
	}
}

func TestNewRefusesBadURLs(t *testing.T) {
	t.Parallel()
	for _, urls := range [][]string{nil, {"127.0.0.1:8080"}, {"ftp://127.0.0.1"}} {
		if _, err := New(urls, http.DefaultTransport, nil); err == nil {
			t.Errorf("New(%q) succeeded", urls)
		}
	}
}
