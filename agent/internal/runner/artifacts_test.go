package runner

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/codemode-go/codemode/agent/internal/wire"
	runnerv1 "github.com/codemode-go/codemode/gen/codemode/runner/v1"
)

// artifactNames lists the names of exit's artifacts, with their media types.
func artifactNames(exit *runnerv1.Exit) []string {
	var names []string
	for _, a := range exit.GetArtifacts() {
		names = append(names, a.GetName()+" "+a.GetMediaType())
	}
	return names
}

func (h *harness) runArtifacts(lang, code string, stateful bool) *runnerv1.Exit {
	h.t.Helper()
	r := h.run(h.t.Context(), &runnerv1.Run{Language: lang, Code: code, Stateful: stateful, Timeout: durationpb.New(20 * time.Second)})
	if r.err != nil || r.exit.GetCode() != 0 {
		h.t.Fatalf("run %q: code %d, err %v, stderr %q", code, r.exit.GetCode(), r.err, r.stderr)
	}
	return r.exit
}

func TestArtifacts(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	png := "\x89PNG\r\n\x1a\n0000"
	exit := h.runArtifacts("bash", `test -d outputs && test -w outputs || exit 3
printf '\x89PNG\r\n\x1a\n0000' > outputs/plot.png
mkdir -p outputs/data && echo a,b > outputs/data/t.csv
printf 'x' > outputs/noext
echo not an artifact > elsewhere.txt`, false)
	got := strings.Join(artifactNames(exit), "; ")
	if want := "data/t.csv text/csv; charset=utf-8; noext text/plain; charset=utf-8; plot.png image/png"; got != want && got != strings.Replace(want, "text/csv; charset=utf-8", "text/csv", 1) {
		t.Errorf("artifacts = %q, want %q", got, want)
	}
	for _, a := range exit.GetArtifacts() {
		if a.GetName() == "plot.png" && string(a.GetContent()) != png {
			t.Errorf("plot.png = %q, want %q", a.GetContent(), png)
		}
	}
	if exit.GetArtifactsTruncated() {
		t.Error("artifacts truncated")
	}

	// A run that leaves nothing has no artifacts, also when outputs is gone.
	if exit := h.runArtifacts("bash", "rm -rf outputs", false); len(exit.GetArtifacts()) != 0 {
		t.Errorf("artifacts of a run that wrote none: %v", artifactNames(exit))
	}
	if exit := h.runArtifacts("bash", "test -d outputs && echo x > outputs/again.txt", false); strings.Join(artifactNames(exit), "") != "again.txt text/plain; charset=utf-8" {
		t.Errorf("outputs not made again: %v", artifactNames(exit))
	}
}

// A session reports what each run adds or changes, and keeps the rest.
func TestArtifactsSession(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	steps := []struct {
		lang, code string
		want       string
	}{
		{"python", "open('outputs/a.txt', 'w').write('1')", "a.txt"},
		{"python", "open('outputs/b.txt', 'w').write('2')", "b.txt"},
		{"bash", "ls outputs | tr '\\n' ' '", ""},
		{"python", "open('outputs/a.txt', 'w').write('one')", "a.txt"},
		{"javascript", "require('fs').writeFileSync('outputs/c.json', '{}')", "c.json"},
	}
	for _, st := range steps {
		exit := h.runArtifacts(st.lang, st.code, true)
		var names []string
		for _, a := range exit.GetArtifacts() {
			names = append(names, a.GetName())
		}
		if got := strings.Join(names, " "); got != st.want {
			t.Errorf("%s %q: artifacts %q, want %q", st.lang, st.code, got, st.want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(h.ws, "outputs", "b.txt")); err != nil || string(b) != "2" {
		t.Errorf("b.txt after the session's runs = %q, %v", b, err)
	}
}

// The walk follows no symbolic link, takes only regular files, and reads
// nothing the user could not read.
func TestArtifactsConfined(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	secret := filepath.Join(filepath.Dir(h.ws), "secret")
	if err := os.WriteFile(secret, []byte("runner's secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A file the user cannot read, as if hard-linked in: only the runner
	// could put it there in this test.
	planted := func() {
		if err := os.WriteFile(filepath.Join(h.ws, "outputs", "root-only"), []byte("runner's secret"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	h.runArtifacts("bash", "true", false) // makes outputs
	planted()
	exit := h.runArtifacts("bash", fmt.Sprintf(`cd outputs
ln -s %s leak
ln -s /proc/1/environ environ
ln -s .. up
ln -s ../.. upup
mkfifo fifo
echo ok > real.txt`, secret), false)
	if got := strings.Join(artifactNames(exit), "; "); got != "real.txt text/plain; charset=utf-8" {
		t.Errorf("artifacts = %q, want only real.txt", got)
	}
	for _, a := range exit.GetArtifacts() {
		if bytes.Contains(a.GetContent(), []byte("secret")) {
			t.Errorf("artifact %s holds the secret", a.GetName())
		}
	}

	// outputs itself a link out of the workspace.
	exit = h.runArtifacts("bash", fmt.Sprintf("rm -rf outputs && ln -s %s outputs", filepath.Dir(secret)), false)
	if len(exit.GetArtifacts()) != 0 {
		t.Errorf("artifacts through a linked outputs directory: %v", artifactNames(exit))
	}
}

func TestArtifactsLimits(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for _, tc := range []struct {
		name, code string
		n          int
	}{
		{"count", fmt.Sprintf("for i in $(seq 1 %d); do echo $i > outputs/f$(printf %%03d $i); done", wire.MaxArtifacts+6), wire.MaxArtifacts},
		{"bytes", fmt.Sprintf("head -c %d /dev/zero > outputs/a.bin; head -c %d /dev/zero > outputs/b.bin; echo c > outputs/c.txt", wire.MaxArtifactBytes-10, 11), 2},
		{"one too large", fmt.Sprintf("head -c %d /dev/zero > outputs/big.bin", wire.MaxArtifactBytes+1), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exit := h.runArtifacts("bash", "rm -rf outputs/*; "+tc.code, false)
			if n := len(exit.GetArtifacts()); n != tc.n || !exit.GetArtifactsTruncated() {
				t.Errorf("%d artifacts, truncated %v; want %d, truncated", n, exit.GetArtifactsTruncated(), tc.n)
			}
			total := 0
			for _, a := range exit.GetArtifacts() {
				total += len(a.GetContent())
			}
			if total > wire.MaxArtifactBytes {
				t.Errorf("%d bytes of artifacts, more than %d", total, wire.MaxArtifactBytes)
			}
		})
	}
}
