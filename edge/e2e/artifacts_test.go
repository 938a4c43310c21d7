package e2e

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"strings"
	"testing"

	"connectrpc.com/connect"

	edgev1 "github.com/codemode-go/codemode/gen/codemode/edge/v1"
	"github.com/codemode-go/codemode/gen/codemode/edge/v1/edgev1connect"
	executionv1 "github.com/codemode-go/codemode/gen/codemode/execution/v1"
)

const plotCode = `import matplotlib.pyplot as plt
plt.plot([1, 3, 2])
plt.show()
print("plotted")`

// checkFigure fails t unless artifacts are exactly one PNG figure that
// decodes.
func checkFigure(t *testing.T, r *executionv1.Result) {
	t.Helper()
	as := r.GetArtifacts()
	if r.GetExitCode() != 0 || len(as) != 1 || r.GetArtifactsTruncated() {
		t.Fatalf("result: exit %d, stderr %q, %d artifacts, truncated %v", r.GetExitCode(), r.GetStderr(), len(as), r.GetArtifactsTruncated())
	}
	a := as[0]
	if a.GetName() != "figure-1.png" || a.GetMediaType() != "image/png" || a.GetSize() != uint64(len(a.GetContent())) {
		t.Fatalf("artifact %s %s, size %d of %d bytes", a.GetName(), a.GetMediaType(), a.GetSize(), len(a.GetContent()))
	}
	if !bytes.HasPrefix(a.GetContent(), []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("artifact does not start with the PNG signature: %q", a.GetContent()[:min(8, len(a.GetContent()))])
	}
	img, err := png.Decode(bytes.NewReader(a.GetContent()))
	if err != nil {
		t.Fatalf("decode the figure: %v", err)
	}
	if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
		t.Fatalf("figure is %v", b)
	}
}

// A matplotlib figure shown with plt.show() comes back as a PNG over every
// protocol, whole and streamed.
func TestArtifactFigure(t *testing.T) {
	t.Parallel()
	s := shared(t)
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL(), p.opts...)
			res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "python", Code: plotCode}))
			if err != nil {
				t.Fatalf("execute: %v\n%s", err, s.Logs())
			}
			if got := res.Msg.GetResult().GetStdout(); got != "plotted\n" {
				t.Errorf("stdout %q", got)
			}
			checkFigure(t, res.Msg.GetResult())
		})
	}
	t.Run("stream", func(t *testing.T) {
		t.Parallel()
		c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
		st, err := c.ExecuteStream(t.Context(), connect.NewRequest(&edgev1.ExecuteStreamRequest{Language: "python", Code: plotCode}))
		if err != nil {
			t.Fatal(err)
		}
		var last *executionv1.Event
		for st.Receive() {
			ev := st.Msg().GetEvent()
			if last.GetResult() != nil {
				t.Errorf("an event after the result: %v", ev)
			}
			last = ev
		}
		if err := st.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		checkFigure(t, last.GetResult())
	})
}

func names(r *executionv1.Result) string {
	var n []string
	for _, a := range r.GetArtifacts() {
		n = append(n, a.GetName())
	}
	return strings.Join(n, " ")
}

// A session keeps its outputs and reports what each run adds or changes; a
// stateless run's outputs are gone once its result is returned.
func TestArtifactLifetime(t *testing.T) {
	t.Parallel()
	s := shared(t)
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL())
	run := func(session, lang, code string) *executionv1.Result {
		t.Helper()
		res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: lang, Code: code, SessionId: session}))
		if err != nil || res.Msg.GetResult().GetExitCode() != 0 {
			t.Fatalf("run %q: %v %v", code, res, err)
		}
		return res.Msg.GetResult()
	}

	sess, err := c.CreateSession(t.Context(), connect.NewRequest(&edgev1.CreateSessionRequest{Language: "python"}))
	if err != nil {
		t.Fatal(err)
	}
	id := sess.Msg.GetSession().GetId()
	t.Cleanup(func() {
		c.CloseSession(context.Background(), connect.NewRequest(&edgev1.CloseSessionRequest{SessionId: id}))
	})
	if r := run(id, "python", "open('outputs/a.txt', 'w').write('a')"); names(r) != "a.txt" {
		t.Errorf("session run 1: artifacts %q, want a.txt", names(r))
	}
	if r := run(id, "bash", "echo b > outputs/b.txt"); names(r) != "b.txt" {
		t.Errorf("session run 2: artifacts %q, want b.txt", names(r))
	}
	if r := run(id, "bash", "ls outputs"); r.GetStdout() != "a.txt\nb.txt\n" || names(r) != "" {
		t.Errorf("session run 3: stdout %q, artifacts %q; want both files kept and none reported", r.GetStdout(), names(r))
	}

	if r := run("", "bash", "echo secret > outputs/left.txt"); names(r) != "left.txt" {
		t.Errorf("stateless run: artifacts %q, want left.txt", names(r))
	}
	for range 3 { // whichever warm sandbox serves it
		if r := run("", "bash", "ls -A outputs; ls -A"); r.GetStdout() != "outputs\n" {
			t.Errorf("a later stateless run sees %q, want only an empty outputs", r.GetStdout())
		}
	}
}

// Files past the limits are left out and the result says so; links are not
// followed.
func TestArtifactLimits(t *testing.T) {
	t.Parallel()
	s := shared(t)
	c := edgev1connect.NewExecutionServiceClient(httpClient, s.Edge.URL(), connect.WithGRPC())
	for _, tc := range []struct {
		name, code, want string
		truncated        bool
	}{
		{"at the limit", "head -c 4194000 /dev/urandom > outputs/full.bin", "full.bin", false},
		{"too large", "head -c 5000000 /dev/zero > outputs/big.bin; echo x > outputs/small.txt", "small.txt", true},
		{"too many", "for i in $(seq 100 170); do echo $i > outputs/f$i; done", "", true},
		{"links", "ln -s /proc/1/environ outputs/env; ln -s /etc/passwd outputs/passwd; ln -s / outputs/root; echo ok > outputs/ok.txt", "ok.txt", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := c.Execute(t.Context(), connect.NewRequest(&edgev1.ExecuteRequest{Language: "bash", Code: tc.code}))
			if err != nil {
				t.Fatal(err)
			}
			r := res.Msg.GetResult()
			got := names(r)
			if tc.name == "too many" {
				want := make([]string, 64)
				for i := range want {
					want[i] = fmt.Sprintf("f%d", 100+i)
				}
				tc.want = strings.Join(want, " ")
			}
			if got != tc.want || r.GetArtifactsTruncated() != tc.truncated {
				t.Errorf("artifacts %q truncated %v; want %q truncated %v (stderr %q)", got, r.GetArtifactsTruncated(), tc.want, tc.truncated, r.GetStderr())
			}
		})
	}
}
